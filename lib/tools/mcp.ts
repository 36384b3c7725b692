// MCP tools: any tool of a Model Context Protocol server (stdio transport,
// @modelcontextprotocol/sdk client) mounted under a tag; the tag's content
// becomes the tool's arguments (a string argument, or a JSON object).
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport, getDefaultEnvironment } from '@modelcontextprotocol/sdk/client/stdio.js';
import { ArpoError, describeType, describeValue, invalidArgument, unknownName } from '../errors';
import type { Tool, ToolCallContext, ToolOutput } from './tool';

/** How to start an MCP server on stdio. */
export interface McpServerSpec {
  command: string;
  args?: string[];
  /** Added to the SDK's safe default environment (HOME, PATH, USER, …): secrets are not inherited. */
  env?: Record<string, string>;
  cwd?: string;
  /** Name for logs and error texts (default: the command). */
  name?: string;
}

/** A tool as the server lists it. */
export interface McpToolInfo {
  readonly name: string;
  readonly description?: string;
  readonly inputSchema: { type?: string; properties?: Record<string, { type?: unknown; description?: string }>; required?: string[] };
}

/** Options of {@link McpConnection.mount}. */
export interface McpMountOptions {
  /** Tag the tool answers to (default: the tool's name). */
  tag?: string;
  /** Name for metrics and the replay cache (default `mcp:<server>/<tool>`). */
  name?: string;
  /** The string argument that receives the content; default: inferred from the schema. */
  argument?: string;
  /** Replay-cache the calls (default true); false for tools with side effects or changing answers. */
  cacheable?: boolean;
}

const MAX_STDERR = 4096;

/** A live connection to one MCP server (one child process). */
export class McpConnection {
  readonly name: string;
  readonly spec: McpServerSpec;
  private client: Client | undefined;
  private listed: McpToolInfo[] = [];
  private stderrTail = '';

  private constructor(spec: McpServerSpec, client: Client) {
    this.spec = spec;
    this.name = spec.name ?? spec.command;
    this.client = client;
  }

  /** Starts the server, completes the MCP handshake and lists its tools. */
  static async connect(spec: McpServerSpec): Promise<McpConnection> {
    if (spec === null || typeof spec !== 'object') throw invalidArgument('a server spec {command, args}', 'spec', spec);
    if (typeof spec.command !== 'string' || spec.command.length === 0) throw invalidArgument('a command', 'spec.command', spec.command);
    if (spec.args !== undefined && (!Array.isArray(spec.args) || spec.args.some((a) => typeof a !== 'string'))) {
      throw invalidArgument('an array of strings', 'spec.args', spec.args);
    }
    const transport = new StdioClientTransport({
      command: spec.command,
      args: spec.args ?? [],
      env: { ...getDefaultEnvironment(), ...(spec.env ?? {}) },
      ...(spec.cwd !== undefined ? { cwd: spec.cwd } : {}),
      stderr: 'pipe',
    });
    const client = new Client({ name: 'arpo', version: '0.1.0' });
    const conn = new McpConnection(spec, client);
    transport.stderr?.on('data', (chunk: Buffer) => {
      conn.stderrTail = (conn.stderrTail + chunk.toString('utf8')).slice(-MAX_STDERR);
    });
    try {
      await client.connect(transport);
      await conn.refreshTools();
    } catch (e) {
      await client.close().catch(() => undefined);
      const tail = conn.stderrTail.trim();
      throw new ArpoError('TOOL_FAILED', `Cannot start MCP server ${conn.name}: ${(e as Error).message}${tail ? `\nserver stderr:\n${tail}` : ''}`, { cause: e });
    }
    return conn;
  }

  private live(): Client {
    if (!this.client) throw new ArpoError('DISPOSED', `MCP server ${this.name} is closed`);
    return this.client;
  }

  /** Lists the server's tools again (servers may change them). */
  async refreshTools(): Promise<McpToolInfo[]> {
    const all: McpToolInfo[] = [];
    let cursor: string | undefined;
    do {
      const page = await this.live().listTools(cursor ? { cursor } : undefined);
      for (const t of page.tools) all.push({ name: t.name, ...(t.description ? { description: t.description } : {}), inputSchema: t.inputSchema as McpToolInfo['inputSchema'] });
      cursor = page.nextCursor;
    } while (cursor);
    this.listed = all;
    return all;
  }

  get tools(): readonly McpToolInfo[] {
    return this.listed;
  }

  /** Calls a tool with an arguments object; `isError` answers come back as `ok: false`. */
  async call(toolName: string, args: Record<string, unknown>, signal?: AbortSignal): Promise<ToolOutput> {
    const result = await this.live().callTool({ name: toolName, arguments: args }, undefined, {
      ...(signal ? { signal } : {}),
      // The runner owns the timeout (through the signal); keep the SDK's out of the way.
      timeout: 24 * 3600 * 1000,
    });
    return { text: resultText(result as CallToolResultLike), ok: result.isError !== true };
  }

  /** A {@link Tool} that calls `toolName` on this server. */
  mount(toolName: string, options: McpMountOptions = {}): McpTool {
    const info = this.listed.find((t) => t.name === toolName);
    if (!info) throw unknownName(`tool of MCP server ${this.name}:`, toolName, this.listed.map((t) => t.name));
    return new McpTool(this, info, options);
  }

  /** Recent stderr of the server (for diagnosing failures). */
  get stderr(): string {
    return this.stderrTail;
  }

  async close(): Promise<void> {
    const c = this.client;
    this.client = undefined;
    await c?.close();
  }
}

interface CallToolResultLike {
  content?: Array<{ type: string; text?: string; mimeType?: string; resource?: { uri?: string; text?: string }; uri?: string; name?: string }>;
  structuredContent?: unknown;
  toolResult?: unknown;
  isError?: boolean;
}

/** Text of a tool result: text items verbatim, other items as a short marker; structured content as JSON when there is no text. */
export function resultText(result: CallToolResultLike): string {
  // A server is a stranger: its reply is checked, and a malformed one is an error naming the field.
  const bad = (what: string, field: string, value: unknown): ArpoError =>
    new ArpoError('TOOL_FAILED', `MCP tool reply: expected ${what} for ${field} but received ${describeValue(value)} of type ${describeType(value)}`);
  if (result === null || typeof result !== 'object' || Array.isArray(result)) throw bad('an object', 'the reply', result);
  const content: unknown = result.content;
  if (content !== undefined && content !== null && !Array.isArray(content)) throw bad('an array', 'content', content);
  const parts: string[] = [];
  const str = (x: unknown): string | undefined => (typeof x === 'string' ? x : undefined);
  ((content ?? []) as unknown[]).forEach((raw, i) => {
    if (raw === null || typeof raw !== 'object' || Array.isArray(raw) || typeof (raw as { type?: unknown }).type !== 'string') {
      throw bad('an object with a string type', `content[${i}]`, raw);
    }
    const item = raw as { type: string; text?: unknown; mimeType?: unknown; resource?: unknown; uri?: unknown; name?: unknown };
    const resource = item.resource !== null && typeof item.resource === 'object' ? (item.resource as { uri?: unknown; text?: unknown }) : undefined;
    const mime = str(item.mimeType);
    if (item.type === 'text' && typeof item.text === 'string') parts.push(item.text);
    else if (item.type === 'resource' && resource) parts.push(str(resource.text) ?? `[resource ${str(resource.uri) ?? ''}]`);
    else if (item.type === 'resource_link') parts.push(`[resource ${str(item.uri) ?? str(item.name) ?? ''}]`);
    else parts.push(`[${item.type}${mime ? ` ${mime}` : ''}]`);
  });
  const json = (x: unknown, field: string): string => {
    try {
      return JSON.stringify(x) ?? String(x);
    } catch (e) {
      throw bad('JSON-serialisable data', field, `(${(e as Error).message})`);
    }
  };
  if (parts.length === 0 && result.structuredContent !== undefined) parts.push(json(result.structuredContent, 'structuredContent'));
  if (parts.length === 0 && result.toolResult !== undefined) parts.push(json(result.toolResult, 'toolResult'));
  return parts.join('\n');
}

/**
 * How the tag's content becomes arguments. `string`: `{ [argument]: content }`
 * (the schema has exactly one string property, or one required string, or
 * the caller named it). `none`: the tool takes no arguments. `json`: the
 * content must be a JSON object.
 */
export type McpArgumentMode = { kind: 'string'; argument: string } | { kind: 'none' } | { kind: 'json' };

export function argumentMode(schema: McpToolInfo['inputSchema'], argument?: string): McpArgumentMode {
  const props = schema.properties ?? {};
  const names = Object.keys(props);
  if (argument !== undefined) {
    if (!names.includes(argument)) throw unknownName('argument', argument, names);
    return { kind: 'string', argument };
  }
  if (names.length === 0) return { kind: 'none' };
  const isString = (n: string) => props[n]?.type === 'string';
  if (names.length === 1 && isString(names[0] as string)) return { kind: 'string', argument: names[0] as string };
  const required = (schema.required ?? []).filter((n) => names.includes(n));
  if (required.length === 1 && isString(required[0] as string)) return { kind: 'string', argument: required[0] as string };
  return { kind: 'json' };
}

/** An MCP server's tool behind a tag. */
export class McpTool implements Tool {
  readonly name: string;
  readonly tag: string;
  readonly cacheKey: string;
  readonly cacheable: boolean;
  readonly mode: McpArgumentMode;

  constructor(readonly connection: McpConnection, readonly info: McpToolInfo, options: McpMountOptions = {}) {
    this.tag = options.tag ?? info.name;
    this.name = options.name ?? `mcp:${connection.name}/${info.name}`;
    this.cacheable = options.cacheable ?? true;
    this.mode = argumentMode(info.inputSchema, options.argument);
    this.cacheKey = JSON.stringify([connection.spec.command, connection.spec.args ?? [], info.name, this.mode]);
  }

  /** The arguments object for `content`, or the text that explains why there is none. */
  argumentsFor(content: string): { args: Record<string, unknown> } | { error: string } {
    const props = Object.keys(this.info.inputSchema.properties ?? {});
    const parsed = parseObject(content);
    if (this.mode.kind === 'none') return { args: {} };
    if (this.mode.kind === 'string') {
      // A model may also write the arguments as JSON: accept an object whose keys are all known.
      if (parsed.value && Object.keys(parsed.value).every((k) => props.includes(k))) return { args: parsed.value };
      return { args: { [this.mode.argument]: content } };
    }
    if (parsed.value) return { args: parsed.value };
    const required = this.info.inputSchema.required ?? [];
    return {
      error: `Error: <${this.tag}> expects a JSON object with fields ${props.map((p) => (required.includes(p) ? `${p} (required)` : p)).join(', ')}; ${parsed.error}.`,
    };
  }

  async execute(content: string, ctx: ToolCallContext): Promise<ToolOutput> {
    const a = this.argumentsFor(content);
    if ('error' in a) return { text: a.error, ok: false };
    try {
      return await this.connection.call(this.info.name, a.args, ctx.signal);
    } catch (e) {
      const tail = this.connection.stderr.trim().split('\n').slice(-3).join('\n');
      throw new ArpoError('TOOL_FAILED', `MCP ${this.connection.name}/${this.info.name}: ${(e as Error).message}${tail ? ` (server stderr: ${tail})` : ''}`, { cause: e });
    }
  }
}

function parseObject(content: string): { value?: Record<string, unknown>; error: string } {
  const s = content.trim();
  if (!s.startsWith('{')) return { error: 'the content is not a JSON object' };
  try {
    const v: unknown = JSON.parse(s);
    if (v !== null && typeof v === 'object' && !Array.isArray(v)) return { value: v as Record<string, unknown>, error: '' };
    return { error: 'the content is not a JSON object' };
  } catch (e) {
    return { error: `invalid JSON (${(e as Error).message})` };
  }
}
