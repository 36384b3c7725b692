// Argument validators for the native wrappers: every check throws
// invalidArgument (`Expected <what> for <name> but received <value> of type
// <type>`) before anything reaches C++.
import { ArpoError, invalidArgument } from '../errors';
import type { LogitsArray } from './types';

/** An integer in [min, max]. */
export function checkInteger(value: unknown, name: string, min: number, max: number = Number.MAX_SAFE_INTEGER): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
    const range = max === Number.MAX_SAFE_INTEGER ? `>= ${min}` : `in [${min}, ${max}]`;
    throw invalidArgument(`an integer ${range}`, name, value);
  }
  return value;
}

/** A finite number satisfying `ok` (described by `what`). */
export function checkNumber(value: unknown, name: string, what: string, ok: (x: number) => boolean = () => true): number {
  if (typeof value !== 'number' || !Number.isFinite(value) || !ok(value)) throw invalidArgument(what, name, value);
  return value;
}

/** Thread count: 0 = every hardware thread. */
export function checkThreads(value: unknown, name = 'threads'): number {
  return value === undefined ? 0 : checkInteger(value, name, 0, 1024);
}

/** A plain options object (undefined = {}). */
export function checkOptions<T extends object>(value: T | undefined, name: string): Partial<T> {
  if (value === undefined) return {};
  if (value === null || typeof value !== 'object' || Array.isArray(value) || ArrayBuffer.isView(value)) {
    throw invalidArgument('an options object', name, value);
  }
  return value;
}

/** Logits (T, V): a Float32Array (float32) or Uint16Array (bf16 bits) of T * V values. */
export function checkLogits(logits: unknown, T: unknown, V: unknown): { T: number; V: number; bf16: boolean } {
  const t = checkInteger(T, 'T', 0);
  const v = checkInteger(V, 'V', 1);
  if (!(logits instanceof Float32Array) && !(logits instanceof Uint16Array)) {
    throw invalidArgument('a Float32Array (float32) or Uint16Array (bf16 bits) of logits', 'logits', logits);
  }
  if (logits.length !== t * v) throw invalidArgument(`a logits array of T * V = ${t * v} values`, 'logits', logits);
  return { T: t, V: v, bf16: logits instanceof Uint16Array };
}

/** A Float32Array of exactly `length` values (zero-copy), for outputs and caller buffers. */
export function checkFloat32Out(value: unknown, name: string, length: number): Float32Array {
  if (!(value instanceof Float32Array) || value.length !== length) throw invalidArgument(`a Float32Array of ${length} values`, name, value);
  return value;
}

/** Numbers -> Float32Array of `length` finite values (a Float32Array is checked and passed as is). */
export function toFloat32(values: unknown, name: string, length: number, allowInfinite = false): Float32Array {
  if (!isArrayLike(values) || values.length !== length) throw invalidArgument(`an array of ${length} numbers`, name, values);
  const out = values instanceof Float32Array ? values : new Float32Array(length);
  for (let i = 0; i < length; i++) {
    const x = (values as ArrayLike<unknown>)[i];
    const ok = typeof x === 'number' && (allowInfinite ? !Number.isNaN(x) : Number.isFinite(x));
    if (!ok) throw invalidArgument(allowInfinite ? 'a number (not NaN)' : 'a finite number', `${name}[${i}]`, x);
    out[i] = x as number;
  }
  return out;
}

/** Integers in [min, max] -> Int32Array of `length` (an Int32Array is checked and passed as is). */
export function toInt32(values: unknown, name: string, length: number, min: number, max: number): Int32Array {
  if (!isArrayLike(values) || values.length !== length) throw invalidArgument(`an array of ${length} integers`, name, values);
  const out = values instanceof Int32Array ? values : new Int32Array(length);
  for (let i = 0; i < length; i++) {
    const x = (values as ArrayLike<unknown>)[i];
    if (typeof x !== 'number' || !Number.isInteger(x) || x < min || x > max) {
      throw invalidArgument(`an integer in [${min}, ${max}]`, `${name}[${i}]`, x);
    }
    out[i] = x;
  }
  return out;
}

/** Integers (number or bigint) >= min -> BigInt64Array of `length`. */
export function toBigInt64(values: unknown, name: string, length: number, min: bigint): BigInt64Array {
  if (!isArrayLike(values) || values.length !== length) throw invalidArgument(`an array of ${length} integers`, name, values);
  const out = values instanceof BigInt64Array ? values : new BigInt64Array(length);
  for (let i = 0; i < length; i++) {
    const x = (values as ArrayLike<unknown>)[i];
    const b = typeof x === 'bigint' ? x : typeof x === 'number' && Number.isSafeInteger(x) ? BigInt(x) : undefined;
    if (b === undefined || b < min || b > 0x7fffffffffffffffn) throw invalidArgument(`an integer >= ${min}`, `${name}[${i}]`, x);
    out[i] = b;
  }
  return out;
}

/** Non-negative integers (number or bigint) < 2^64 -> BigUint64Array of `length`. */
export function toBigUint64(values: unknown, name: string, length: number): BigUint64Array {
  if (!isArrayLike(values) || values.length !== length) throw invalidArgument(`an array of ${length} integers`, name, values);
  const out = values instanceof BigUint64Array ? values : new BigUint64Array(length);
  if (values instanceof BigUint64Array) return out;
  for (let i = 0; i < length; i++) {
    const x = (values as ArrayLike<unknown>)[i];
    const b = typeof x === 'bigint' ? x : typeof x === 'number' && Number.isSafeInteger(x) ? BigInt(x) : undefined;
    if (b === undefined || b < 0n || b > 0xffffffffffffffffn) throw invalidArgument('an integer in [0, 2^64)', `${name}[${i}]`, x);
    out[i] = b;
  }
  return out;
}

/** A seed: a non-negative safe integer or a bigint < 2^64. */
export function toSeed(value: unknown, name = 'seed'): bigint {
  if (value === undefined) return 0n;
  if (typeof value === 'bigint' && value >= 0n && value <= 0xffffffffffffffffn) return value;
  if (typeof value === 'number' && Number.isSafeInteger(value) && value >= 0) return BigInt(value);
  throw invalidArgument('a non-negative integer or bigint < 2^64', name, value);
}

function isArrayLike(value: unknown): value is ArrayLike<unknown> {
  return Array.isArray(value) || (ArrayBuffer.isView(value) && !(value instanceof DataView));
}

/** Native errors become ArpoError('NATIVE_OP_FAILED', '<op>: <message>'). */
export function nativeError(op: string, e: unknown, callerStack?: string): ArpoError {
  if (e instanceof ArpoError) return e;
  // The kernels prefix their messages with their C++ name (e.g. "policy_loss: "); keep one prefix.
  // (N-API errors may come from another realm, e.g. under Jest: read .message, not instanceof.)
  const raw = typeof (e as { message?: unknown })?.message === 'string' ? (e as { message: string }).message : String(e);
  const message = raw.replace(/^[a-z_]+: /, '');
  const err = new ArpoError('NATIVE_OP_FAILED', `${op}: ${message}`, { cause: e });
  // Async rejections have no JS frames of the caller: reuse the stack captured before the call.
  if (callerStack) err.stack = `${err.name}: ${err.message}\n${callerStack.split('\n').slice(1).join('\n')}`;
  return err;
}

/** Runs a native call, rethrowing its errors as NATIVE_OP_FAILED. */
export function callNative<R>(op: string, fn: () => R): R {
  try {
    return fn();
  } catch (e) {
    throw nativeError(op, e);
  }
}

/** Awaits a native async call; the rejection carries the caller's stack. */
export async function callNativeAsync<R>(op: string, fn: () => Promise<R>): Promise<R> {
  const callerStack = new Error().stack;
  try {
    return await fn();
  } catch (e) {
    throw nativeError(op, e, callerStack);
  }
}

export type { LogitsArray };

/** A model device: cpu, cuda or cuda:N (model.device, PolicyModel options.device). */
export const DEVICE_PATTERN = /^(cpu|cuda(:\d{1,3})?)$/;
