// The demo's real tools: lib/tools' SQLite FTS5 search over the demo corpus and the sandboxed
// python, behind a ToolRunner, as one `RunTool` whose text is exactly what a rollout puts in <result>.
import * as path from 'path';
import { invalidArgument } from '../../errors';
import { escapeToolOutput } from '../../tools/protocol';
import { fullIsolationProblem, PythonTool, type PythonSandboxOptions } from '../../tools/python';
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

let demoIsolationLevel: 'full' | 'basic' | undefined;
/**
 * The python isolation of the demo's own runs: `full` where this machine gives
 * it, else `basic` with one warning line on stderr (once per process), so that
 * a newcomer's first command works; `arpo train` never does this implicitly.
 */
export function demoIsolation(warn: (line: string) => void = (l) => void process.stderr.write(`${l}\n`)): 'full' | 'basic' {
  if (demoIsolationLevel === undefined) {
    const problem = fullIsolationProblem();
    demoIsolationLevel = problem === null ? 'full' : 'basic';
    if (problem !== null) warn(`[demo] warning: the demo runs python with basic isolation (arpo train would refuse): ${problem}`);
  }
  return demoIsolationLevel;
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
  runner.register(new PythonTool({ isolation: demoIsolation(), ...options.python }));
  const runTool: RunTool = async (tag, content) => escapeToolOutput((await runner.run(tag, content)).text);
  return { runner, runTool, close: () => runner.close() };
}
