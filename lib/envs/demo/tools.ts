// The demo's real tools: lib/tools' SQLite FTS5 search over the demo corpus and the sandboxed
// python, behind a ToolRunner, as one `RunTool` whose text is exactly what a rollout puts in <result>.
import * as path from 'path';
import { invalidArgument } from '../../errors';
import { escapeToolOutput } from '../../tools/protocol';
import { PythonTool, type PythonSandboxOptions } from '../../tools/python';
import { ToolRunner, type ToolRunnerOptions } from '../../tools/runner';
import { SearchIndex, SearchTool } from '../../tools/search';
import type { RunTool } from './local-tools';

export interface DemoToolsOptions {
  /** Index file (default: `corpus.fts.sqlite` beside the corpus). */
  readonly indexPath?: string;
  /** Pages per search answer (default 3: the demo's documents are short and sequences must stay short). */
  readonly topK?: number;
  /** Characters per page (default 400: a whole demo document). */
  readonly snippetChars?: number;
  readonly python?: PythonSandboxOptions;
  readonly runner?: ToolRunnerOptions;
}

export interface DemoTools {
  readonly runner: ToolRunner;
  /** The runner's text for a call, escaped as `formatResult` escapes it: what goes between ` <result>\n` and `\n</result>`. */
  readonly runTool: RunTool;
  close(): Promise<void>;
}

/**
 * Opens the search index of a demo corpus and mounts `<search>` and `<python>`
 * on a ToolRunner. Use the same runner (or the same options) in the rollout, so
 * SFT traces and RL rollouts see identical tool output.
 */
export async function openDemoTools(corpusPath: string, options: DemoToolsOptions = {}): Promise<DemoTools> {
  if (typeof corpusPath !== 'string' || corpusPath.length === 0) throw invalidArgument('a corpus.jsonl path', 'corpusPath', corpusPath);
  const index = await SearchIndex.openJsonl(corpusPath, { indexPath: options.indexPath ?? path.join(path.dirname(corpusPath), 'corpus.fts.sqlite') });
  const runner = new ToolRunner(options.runner ?? {});
  runner.register(new SearchTool(index, { topK: options.topK ?? 3, snippetChars: options.snippetChars ?? 400 }));
  runner.register(new PythonTool(options.python ?? {}));
  const runTool: RunTool = async (tag, content) => escapeToolOutput((await runner.run(tag, content)).text);
  return { runner, runTool, close: () => runner.close() };
}
