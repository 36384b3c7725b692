// `arpo init-model`: a randomly initialised HF checkpoint (qwen2 / qwen3 /
// llama) from a config, written in pure TypeScript so it needs no libtorch and
// is bit-reproducible: weights ~ N(0, initializer_range) from a seeded PRNG
// keyed by (seed, tensor name), norms 1, biases 0 (HF `_init_weights`).
import * as fs from 'fs';
import * as path from 'path';
import { Command, InvalidArgumentError } from 'commander';
import { ArpoError, invalidArgument } from '../errors';
import { expectedTensorShapes, MODEL_TYPES, parseModelConfig, tinyConfig, writeCheckpointDir, type ModelConfig, type ModelType } from '../model/checkpoint';
import { float64ToBytes, writeSafetensors, type SafetensorsDType, type TensorToWrite } from '../model/safetensors';
import { buildTinyBpeTokenizer, Tokenizer } from '../model/tokenizer';

export const INIT_DTYPES = { float32: 'F32', bfloat16: 'BF16', float16: 'F16' } as const satisfies Record<string, SafetensorsDType>;
export type InitDType = keyof typeof INIT_DTYPES;

// ------------------------------------------------------------ seeded normal PRNG
const MASK64 = (1n << 64n) - 1n;
/** SplitMix64 step (Steele et al. 2014): seeds the generator state from any 64-bit key. */
function splitmix64(state: bigint): [bigint, bigint] {
  const next = (state + 0x9e3779b97f4a7c15n) & MASK64;
  let z = next;
  z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK64;
  z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK64;
  return [next, z ^ (z >> 31n)];
}

/** FNV-1a 64 of a string's UTF-8 bytes: the per-tensor stream key. */
function fnv1a64(text: string): bigint {
  let h = 0xcbf29ce484222325n;
  for (const b of Buffer.from(text, 'utf8')) h = ((h ^ BigInt(b)) * 0x100000001b3n) & MASK64;
  return h;
}

/**
 * xoshiro128** (Blackman & Vigna) in 32-bit integer arithmetic, seeded by
 * SplitMix64 of (seed, tensor name): each tensor's values depend only on the
 * seed and its name, never on the order tensors are generated in.
 */
export class NormalSampler {
  private s0: number;
  private s1: number;
  private s2: number;
  private s3: number;
  private spare: number | null = null;

  constructor(seed: bigint, stream: string) {
    let st = (seed ^ fnv1a64(stream)) & MASK64;
    const words: number[] = [];
    for (let i = 0; i < 2; i++) {
      const [next, z] = splitmix64(st);
      st = next;
      words.push(Number(z & 0xffffffffn), Number(z >> 32n));
    }
    [this.s0, this.s1, this.s2, this.s3] = words as [number, number, number, number];
    if ((this.s0 | this.s1 | this.s2 | this.s3) === 0) this.s0 = 1; // the all-zero state is a fixed point
  }

  nextU32(): number {
    const result = Math.imul(rotl(Math.imul(this.s1, 5), 7), 9) >>> 0;
    const t = this.s1 << 9;
    this.s2 ^= this.s0;
    this.s3 ^= this.s1;
    this.s1 ^= this.s2;
    this.s0 ^= this.s3;
    this.s2 ^= t;
    this.s3 = rotl(this.s3, 11);
    return result;
  }

  /** Uniform in the open interval (0, 1) with 53 random bits. */
  nextUniform(): number {
    const hi = this.nextU32() >>> 5; // 27 bits
    const lo = this.nextU32() >>> 6; // 26 bits
    return (hi * 67108864 + lo + 0.5) / 9007199254740992;
  }

  /** Standard normal by Box–Muller (both values of each pair are used). */
  nextNormal(): number {
    if (this.spare !== null) {
      const s = this.spare;
      this.spare = null;
      return s;
    }
    const r = Math.sqrt(-2 * Math.log(this.nextUniform()));
    const theta = 2 * Math.PI * this.nextUniform();
    this.spare = r * Math.sin(theta);
    return r * Math.cos(theta);
  }
}

function rotl(x: number, k: number): number {
  return (x << k) | (x >>> (32 - k));
}

// ------------------------------------------------------------ init
export interface InitModelOptions {
  /** Path of a config.json (or `tiny:<qwen2|qwen3|llama>` for the tiny test configs). */
  configPath?: string;
  /** The config.json object itself (used when configPath is absent). */
  config?: Record<string, unknown>;
  /** Output checkpoint directory (replaced atomically if it exists). */
  out: string;
  seed?: number | bigint;
  /** Weight dtype on disk; default: the config's torch_dtype (float32 when absent). */
  dtype?: InitDType;
  /** Tokenizer files to copy into the checkpoint. A `tiny:` config without one gets the tiny byte-level tokenizer (tinyTokenizer). */
  tokenizerDir?: string;
}

/** max_position_embeddings of a tiny checkpoint with the tiny tokenizer (at least). */
export const TINY_TOKENIZER_POSITIONS = 4096;

/** Words of the tag protocol (ARPO.md): one token each in the tiny tokenizer, with and without a leading space (python before think: its "th" merge would cut "python"). */
export const TINY_TOKENIZER_WORDS = ['python', 'think', 'search', 'result', 'answer', 'boxed', 'print'] as const;

/**
 * The tokenizer a `tiny:` checkpoint ships with when no --tokenizer is given:
 * byte-level BPE (every string encodes and round-trips, whatever the data's
 * language), the protocol words as single tokens, ChatML specials and chat
 * template; `vocabSize` is its token count rounded up to a multiple of 64
 * (the embedding rows the config needs).
 */
export function tinyTokenizer(): { files: Record<string, string>; tokens: number; vocabSize: number; bos: number; eos: number } {
  const t = buildTinyBpeTokenizer(TINY_TOKENIZER_WORDS);
  const model = t.tokenizerJson.model as { vocab: Record<string, number> };
  const added = t.tokenizerJson.added_tokens as { id: number; content: string }[];
  const tokens = Math.max(...Object.values(model.vocab), ...added.map((a) => a.id)) + 1;
  const special = (content: string): number => added.find((a) => a.content === content)!.id;
  return {
    bos: special('<|endoftext|>'),
    eos: special('<|im_end|>'),
    files: { 'tokenizer.json': JSON.stringify(t.tokenizerJson), 'tokenizer_config.json': `${JSON.stringify(t.tokenizerConfig, null, 2)}\n` },
    tokens,
    vocabSize: Math.ceil(tokens / 64) * 64,
  };
}

export interface InitModelResult {
  dir: string;
  config: ModelConfig;
  tensors: number;
  parameters: number;
}

/** Value of one tensor at init: HF `_init_weights` (normal for matrices and embeddings, 1 for RMSNorm weights, 0 for biases). */
export function initialValues(name: string, numel: number, std: number, seed: bigint): Float32Array {
  // float32 (the value every dtype is rounded from) halves the memory of a float64 buffer.
  const out = new Float32Array(numel);
  if (name.endsWith('norm.weight')) return out.fill(1);
  if (name.endsWith('.bias')) return out;
  const rng = new NormalSampler(seed, name);
  for (let i = 0; i < numel; i++) out[i] = std * rng.nextNormal();
  return out;
}

function loadConfigArg(options: InitModelOptions): Record<string, unknown> {
  if (options.configPath !== undefined) {
    const spec = options.configPath;
    if (spec.startsWith('tiny:')) {
      const type = spec.slice(5);
      if (!(MODEL_TYPES as readonly string[]).includes(type)) throw invalidArgument(`tiny:<${MODEL_TYPES.join('|')}>`, 'config', spec);
      return tinyConfig(type as ModelType);
    }
    let text: string;
    try {
      text = fs.readFileSync(spec, 'utf8');
    } catch (e) {
      throw new ArpoError('BAD_CONFIG', `${spec}: cannot read (${(e as Error).message})`);
    }
    try {
      return JSON.parse(text) as Record<string, unknown>;
    } catch (e) {
      throw new ArpoError('BAD_CONFIG', `${spec}: not valid JSON (${(e as Error).message})`);
    }
  }
  if (options.config !== undefined) return { ...options.config };
  throw invalidArgument('a config file path or a config object', 'configPath/config', undefined);
}

/** Writes a randomly initialised checkpoint directory; see the file header. */
export async function initModel(options: InitModelOptions): Promise<InitModelResult> {
  if (typeof options.out !== 'string' || options.out === '') throw invalidArgument('a directory path', 'out', options.out);
  const seedIn = options.seed ?? 0;
  if (!(typeof seedIn === 'bigint' || (typeof seedIn === 'number' && Number.isSafeInteger(seedIn))) || BigInt(seedIn) < 0n) {
    throw invalidArgument('a non-negative integer', 'seed', seedIn);
  }
  const seed = BigInt(seedIn) & MASK64;
  const raw = loadConfigArg(options);
  const source = options.configPath ?? 'config';
  const dtypeName = options.dtype ?? (typeof raw.torch_dtype === 'string' ? raw.torch_dtype : 'float32');
  if (!Object.prototype.hasOwnProperty.call(INIT_DTYPES, dtypeName)) {
    throw invalidArgument(`one of ${Object.keys(INIT_DTYPES).join(', ')}`, 'dtype', dtypeName);
  }
  const saved: Record<string, unknown> = { ...raw, torch_dtype: dtypeName };
  // A tiny config without a tokenizer gets the tiny byte-level one, and the embedding rows it needs.
  const tiny = options.configPath?.startsWith('tiny:') === true && options.tokenizerDir === undefined ? tinyTokenizer() : undefined;
  if (tiny !== undefined) {
    if (!(typeof saved.vocab_size === 'number' && saved.vocab_size >= tiny.tokens)) saved.vocab_size = tiny.vocabSize;
    // Byte-level tokens are ~1 per character: the reference data's prompts (system prompt and question) need a few thousand positions.
    if (!(typeof saved.max_position_embeddings === 'number' && saved.max_position_embeddings >= TINY_TOKENIZER_POSITIONS)) saved.max_position_embeddings = TINY_TOKENIZER_POSITIONS;
    Object.assign(saved, { bos_token_id: tiny.bos, eos_token_id: tiny.eos });
  }
  delete (saved as { dtype?: unknown }).dtype;
  const config = parseModelConfig(saved, source);
  if (options.tokenizerDir !== undefined && fs.existsSync(path.join(options.tokenizerDir, 'tokenizer.json'))) {
    // Every token id the tokenizer can produce needs an embedding row.
    const tokens = Tokenizer.fromDir(options.tokenizerDir).vocabSize;
    if (tokens > config.vocabSize) {
      throw new ArpoError('BAD_CONFIG', `${source}: vocab_size ${config.vocabSize} is smaller than the ${tokens} tokens of the tokenizer in ${options.tokenizerDir}`);
    }
  }
  const stDType = INIT_DTYPES[dtypeName as InitDType];
  const shapes = expectedTensorShapes(config);
  let parameters = 0;
  const tensors: TensorToWrite[] = shapes.map(([name, shape]) => {
    const numel = shape.reduce((a, d) => a * d, 1);
    parameters += numel;
    // Produced lazily when the writer reaches it: one tensor in memory at a time.
    return { name, dtype: stDType, shape, data: () => float64ToBytes(stDType, initialValues(name, numel, config.initializerRange, seed)) };
  });
  const dir = path.resolve(options.out);
  await writeCheckpointDir(dir, {
    config: saved,
    tokenizerDir: options.tokenizerDir,
    ...(tiny !== undefined ? { extraFiles: tiny.files } : {}),
    writeWeights: (staging) => writeSafetensors(path.join(staging, 'model.safetensors'), tensors, { format: 'pt' }),
  });
  return { dir, config, tensors: tensors.length, parameters };
}

// ------------------------------------------------------------ CLI
function parseSeed(value: string): number {
  if (!/^\d+$/.test(value) || !Number.isSafeInteger(Number(value))) throw new InvalidArgumentError(`expected a non-negative integer, got ${JSON.stringify(value)}`);
  return Number(value);
}
function parseDType(value: string): InitDType {
  if (!Object.prototype.hasOwnProperty.call(INIT_DTYPES, value)) {
    throw new InvalidArgumentError(`expected one of ${Object.keys(INIT_DTYPES).join(', ')}, got ${JSON.stringify(value)}`);
  }
  return value as InitDType;
}

/** The `init-model` subcommand (the CLI main registers it with `program.addCommand`). */
export function initModelCommand(): Command {
  return new Command('init-model')
    .description('write a randomly initialised HF checkpoint (qwen2 | qwen3 | llama) from a config.json')
    .requiredOption('--config <json>', 'config.json path, or tiny:qwen2 | tiny:qwen3 | tiny:llama')
    .requiredOption('--out <dir>', 'output checkpoint directory (replaced atomically)')
    .option('--seed <n>', 'random seed', parseSeed, 0)
    .option('--dtype <dtype>', 'weight dtype: float32 | bfloat16 | float16 (default: the config torch_dtype)', parseDType)
    .option('--tokenizer <dir>', 'directory with tokenizer.json / tokenizer_config.json to copy (a tiny: config without it gets a byte-level tokenizer with ChatML and the protocol words)')
    .action(async (opts: { config: string; out: string; seed: number; dtype?: InitDType; tokenizer?: string }) => {
      const result = await initModel({ configPath: opts.config, out: opts.out, seed: opts.seed, dtype: opts.dtype, tokenizerDir: opts.tokenizer });
      const c = result.config;
      process.stdout.write(
        `${result.dir}: ${c.modelType} ${c.numHiddenLayers} layers, hidden ${c.hiddenSize}, vocab ${c.vocabSize}, ` +
          `${result.parameters.toLocaleString('en-US')} parameters in ${result.tensors} tensors\n`,
      );
    });
}
