// Error classes shared by every layer: each has a stable string `code`, and
// argument errors use one message form, `Expected <what> for <name> but
// received <value> of type <type>`.

export type ArpoErrorCode =
  | 'INVALID_ARGUMENT'
  | 'NATIVE_OP_FAILED'
  | 'NATIVE_NOT_BUILT'
  | 'DISPOSED'
  | 'BAD_CHECKPOINT'
  | 'BAD_CONFIG'
  | 'BAD_DATA'
  | 'TOOL_TIMEOUT'
  | 'TOOL_FAILED'
  | 'SANDBOX_UNAVAILABLE'
  | 'UNKNOWN_NAME'
  | 'DIST_FAILED';

export class ArpoError extends Error {
  readonly code: ArpoErrorCode;
  constructor(code: ArpoErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
    this.name = 'ArpoError';
  }
}

/** Short printable form of any value for error messages (bounded length). */
export function describeValue(value: unknown): string {
  let s: string;
  if (typeof value === 'string') s = JSON.stringify(value);
  else if (typeof value === 'bigint') s = `${value}n`;
  else if (ArrayBuffer.isView(value)) s = `${value.constructor.name}(${(value as unknown as { length?: number }).length ?? value.byteLength})`;
  else if (Array.isArray(value)) s = `Array(${value.length})`;
  else if (typeof value === 'function') s = `function ${value.name || '(anonymous)'}`;
  else if (value !== null && typeof value === 'object') {
    try {
      s = JSON.stringify(value);
    } catch {
      s = String(value);
    }
  } else s = String(value);
  return s.length > 80 ? `${s.slice(0, 77)}...` : s;
}

/** Type name for messages: typed arrays and classes by constructor name. */
export function describeType(value: unknown): string {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'array';
  if (ArrayBuffer.isView(value)) return value.constructor.name;
  return typeof value;
}

/** `Expected <what> for <name> but received <value> of type <type>`. */
export function invalidArgument(what: string, name: string, value: unknown): ArpoError {
  return new ArpoError(
    'INVALID_ARGUMENT',
    `Expected ${what} for ${name} but received ${describeValue(value)} of type ${describeType(value)}`,
  );
}

/** Unknown registry key: the message lists the known ones. */
export function unknownName(kind: string, name: string, known: readonly string[]): ArpoError {
  return new ArpoError('UNKNOWN_NAME', `Unknown ${kind} ${JSON.stringify(name)}; known: ${[...known].sort().join(', ')}`);
}
