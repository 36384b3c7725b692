// One call that sets up the ARPO reference's tools: `<search>` over the search
// cache (or a JSONL corpus) and the sandboxed `<python>`, behind one ToolRunner.
import { invalidArgument } from '../errors';
import { PythonTool, type PythonSandboxOptions } from './python';
import { ToolCallCache } from './replay';
import { ToolRunner, type ToolRunnerOptions } from './runner';
import { defaultSearchCachePath, SearchIndex, SearchTool, type SearchToolOptions } from './search';

/** Options of {@link createArpoTools}; every field optional. */
export interface ArpoToolsOptions extends Omit<ToolRunnerOptions, 'cache' | 'ownsCache'> {
  /**
   * What `<search>` searches: `{ searchCache: path }` (the ARPO cache format),
   * `{ jsonl: path }` (`{id, title, text}` lines), or false for no search tool.
   * Default: the ARPO search cache at {@link defaultSearchCachePath}.
   */
  search?: ({ searchCache?: string; jsonl?: string; indexPath?: string } & SearchToolOptions) | false;
  /** Sandbox settings for `<python>`, or false for no python tool. */
  python?: (PythonSandboxOptions & { tag?: string }) | false;
  /** Replay-cache file of every call (see ReplayMode); none by default. */
  cacheFile?: string;
}

/** A ToolRunner with the reference's `<search>` and `<python>` mounted; `close()` frees everything. */
export async function createArpoTools(options: ArpoToolsOptions = {}): Promise<ToolRunner> {
  if (options === null || typeof options !== 'object') throw invalidArgument('an options object', 'options', options);
  const { search, python, cacheFile, ...runnerOptions } = options;
  const cache = cacheFile !== undefined ? ToolCallCache.open(cacheFile) : undefined;
  let runner: ToolRunner;
  try {
    runner = new ToolRunner({ ...runnerOptions, ...(cache ? { cache, ownsCache: true } : {}) });
  } catch (e) {
    cache?.close();
    throw e;
  }
  try {
    if (search !== false) {
      const s = search ?? {};
      if (s.searchCache !== undefined && s.jsonl !== undefined) throw invalidArgument('either searchCache or jsonl, not both', 'search', s);
      const indexOptions = s.indexPath !== undefined ? { indexPath: s.indexPath } : {};
      const index = s.jsonl !== undefined ? await SearchIndex.openJsonl(s.jsonl, indexOptions) : await SearchIndex.openSearchCache(s.searchCache ?? defaultSearchCachePath(), indexOptions);
      runner.register(new SearchTool(index, s));
    }
    if (python !== false) runner.register(new PythonTool(python ?? {}));
  } catch (e) {
    await runner.close().catch(() => undefined);
    throw e;
  }
  return runner;
}
