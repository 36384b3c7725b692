// Public API of arpo's tools: the tag protocol, the runner, search, python, MCP and the replay cache.
//
// How the rollout engine uses it (one trajectory):
//   const protocol = createProtocol();                      // reference tags, call limit 5
//   const tools = await createArpoTools({ cacheFile });     // <search> + sandboxed <python>
//   generate with stop strings protocol.stopStrings         // ['</search>', '</python>']
//   const call = parseToolCall(text, protocol, { from: segmentStart });
//   if (call.kind === 'none') -> 'answer' | 'no_call' (EOS) | 'unclosed' (cut off mid-call)
//   else if (!canCallTool(callsMade, protocol)) -> end the path (reference: append EOS)
//   else { const r = await tools.run(call.tag, call.content, { signal });
//          append formatResult(r.text, protocol) as tool tokens (loss mask 0) }
// `run` never throws for a tool's failure: r.ok / r.timedOut / r.error say what
// happened and r.text already explains it to the model.
export {
  createProtocol,
  DEFAULT_PROTOCOL,
  parseToolCall,
  formatResult,
  escapeToolOutput,
  canCallTool,
  decodeModelText,
  assertToolTag,
} from './protocol';
export type { ToolProtocol, ToolProtocolOptions, ToolCall, NoToolCall, ToolCallParse, ParseOptions, CallsInThink } from './protocol';
export type { Tool, ToolCallContext, ToolOutput, ToolRunResult } from './tool';
export { ToolRunner, truncateOutput } from './runner';
export type { ToolRunnerOptions, ToolMetrics, RunOptions } from './runner';
export { ToolCallCache, callKey, REPLAY_MODES } from './replay';
export type { ReplayMode, CachedCall } from './replay';
export {
  SearchIndex,
  SearchTool,
  NO_RESULTS,
  defaultSearchCachePath,
  defaultIndexDir,
  normalizeQuery,
  queryTerms,
  searchTerms,
  toFtsQuery,
  makeSnippet,
  formatPages,
} from './search';
export type { SearchHit, SearchIndexOptions, SearchToolOptions } from './search';
export { readCorpus, splitCachedPages } from './corpus';
export type { CorpusKind, CorpusPage } from './corpus';
export { PythonSandbox, PythonTool, detectIsolation, describeRun, isolationError, fullIsolationProblem } from './python';
export type { Isolation, PythonSandboxOptions, PythonRun } from './python';
export { McpConnection, McpTool, argumentMode, resultText } from './mcp';
export type { McpServerSpec, McpToolInfo, McpMountOptions, McpArgumentMode } from './mcp';
export { createArpoTools } from './defaults';
export type { ArpoToolsOptions } from './defaults';
