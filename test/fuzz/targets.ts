// Fuzz targets: each builds valid seeds once, then for a case applies seeded
// mutations and runs the real parser. A case passes when the parser returns a
// result (checked for basic sanity) or throws an ArpoError whose message names
// the file or the field; anything else (a TypeError, a RangeError, a hang) is
// a defect. Used by test/fuzz/fuzz.test.ts (bounded) and scripts/fuzz.ts (long).
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { ArpoError } from '../../lib/errors';
import { PromptDataset } from '../../lib/data';
import { readModelConfig, tinyConfig } from '../../lib/model/checkpoint';
import { buildTinyBpeTokenizer, Tokenizer, writeTokenizerFiles } from '../../lib/model/tokenizer';
import { bytesToFloat64, openCheckpointTensors, SafetensorsFile, writeSafetensors } from '../../lib/model/safetensors';
import Database from 'better-sqlite3';
import { resultText } from '../../lib/tools/mcp';
import { callKey, ToolCallCache } from '../../lib/tools/replay';
import { parseToolCall } from '../../lib/tools/protocol';
import { loadConfig, validateConfig } from '../../lib/train/config';
import type { Rng } from '../../lib/envs/demo/rng';
import { caseRng, mutateBytes, mutateJson, mutateJsonText } from './mutate';

export interface FuzzTarget {
  readonly name: string;
  /** Why this target cannot run here (its seed is missing), when it cannot. */
  readonly skip?: string;
  /** Runs case `index`; throws only for a defect. */
  run(seed: number, index: number): Promise<'ok' | 'rejected'> | 'ok' | 'rejected';
}

/** Classifies an exception: an ArpoError naming `mustName` (one of the strings) is a clean rejection. */
function rejected(e: unknown, what: string, mustName: readonly string[]): 'rejected' {
  if (e instanceof ArpoError && mustName.some((n) => e.message.includes(n))) return 'rejected';
  const detail = e instanceof Error ? `${e.name}: ${e.message.slice(0, 300)}` : String(e);
  throw new Error(`${what}: not a clean rejection (want an ArpoError naming ${mustName.map((n) => JSON.stringify(n)).join(' or ')}): ${detail}`);
}

export function makeTargets(dir: string): FuzzTarget[] {
  fs.mkdirSync(dir, { recursive: true });
  const w = (name: string, data: string | Buffer): string => {
    const f = path.join(dir, name);
    fs.writeFileSync(f, data);
    return f;
  };

  // ------------------------------------------------------------ safetensors
  const stFile = path.join(dir, 'seed.safetensors');
  writeSafetensors(stFile, [
    { name: 'a.weight', dtype: 'F32', shape: [3, 4], data: Buffer.from(new Float32Array(12).map((_, i) => i - 5).buffer) },
    { name: 'b', dtype: 'BF16', shape: [5], data: Buffer.alloc(10, 0x3f) },
    { name: 'c.bias', dtype: 'I64', shape: [2], data: Buffer.alloc(16, 1) },
  ], { format: 'pt' });
  const stSeed = fs.readFileSync(stFile);
  const stHeader = JSON.parse(stSeed.subarray(8, 8 + Number(stSeed.readBigUInt64LE(0))).toString('utf8')) as Record<string, unknown>;
  const stData = stSeed.subarray(8 + Number(stSeed.readBigUInt64LE(0)));
  const openAll = (file: string): void => {
    const st = SafetensorsFile.open(file);
    for (const [name, info] of st.tensors) {
      const bytes = st.loadBytes(name);
      if (bytes.length !== info.end - info.begin) throw new Error(`safetensors: ${name} read ${bytes.length} bytes, header says ${info.end - info.begin}`);
      bytesToFloat64(info.dtype, bytes);
    }
  };
  const safetensors: FuzzTarget = {
    name: 'safetensors (TS reader)',
    run(seed, index) {
      const rng = caseRng(seed, index);
      let bytes: Buffer;
      if (rng.next() < 0.5) {
        bytes = mutateBytes(rng, stSeed);
      } else {
        // a well-framed file around a mutated header
        const text = rng.next() < 0.5 ? JSON.stringify(mutateJson(rng, stHeader)) : mutateJsonText(rng, stHeader);
        const h = Buffer.from(text ?? 'null', 'utf8');
        const len = Buffer.alloc(8);
        len.writeBigUInt64LE(BigInt(h.length));
        bytes = Buffer.concat([len, h, stData]);
      }
      const f = w(`case.safetensors`, bytes);
      try {
        openAll(f);
        return 'ok';
      } catch (e) {
        return rejected(e, 'safetensors', [f]);
      }
    },
  };

  // ------------------------------------------------------------ sharded index + config.json
  const ckDir = path.join(dir, 'ckpt');
  fs.mkdirSync(ckDir, { recursive: true });
  writeSafetensors(path.join(ckDir, 'model-00001-of-00002.safetensors'), [{ name: 'x', dtype: 'F32', shape: [2], data: Buffer.alloc(8) }]);
  writeSafetensors(path.join(ckDir, 'model-00002-of-00002.safetensors'), [{ name: 'y', dtype: 'F32', shape: [1], data: Buffer.alloc(4) }]);
  const indexSeed = { metadata: { total_size: 12 }, weight_map: { x: 'model-00001-of-00002.safetensors', y: 'model-00002-of-00002.safetensors' } };
  const indexFile = path.join(ckDir, 'model.safetensors.index.json');
  const shardIndex: FuzzTarget = {
    name: 'model.safetensors.index.json',
    run(seed, index) {
      const rng = caseRng(seed, index);
      fs.writeFileSync(indexFile, rng.next() < 0.5 ? JSON.stringify(mutateJson(rng, indexSeed)) ?? 'null' : mutateJsonText(rng, indexSeed));
      try {
        const m = openCheckpointTensors(ckDir);
        for (const { file, info } of m.values()) if (info.end > info.begin) file.loadBytes([...file.tensors.entries()].find(([, i]) => i === info)![0]);
        return 'ok';
      } catch (e) {
        return rejected(e, 'index', [indexFile, ckDir]);
      }
    },
  };
  const cfgDir = path.join(dir, 'cfg');
  fs.mkdirSync(cfgDir, { recursive: true });
  const modelCfgSeed = tinyConfig('qwen3');
  const modelConfig: FuzzTarget = {
    name: 'config.json of a model',
    run(seed, index) {
      const rng = caseRng(seed, index);
      const f = path.join(cfgDir, 'config.json');
      fs.writeFileSync(f, rng.next() < 0.6 ? JSON.stringify(mutateJson(rng, modelCfgSeed)) ?? 'null' : mutateJsonText(rng, modelCfgSeed));
      try {
        const c = readModelConfig(cfgDir).config;
        if (!(c.hiddenSize > 0 && c.numHiddenLayers > 0 && c.vocabSize > 0)) throw new Error(`config.json accepted with hidden ${c.hiddenSize}, layers ${c.numHiddenLayers}, vocab ${c.vocabSize}`);
        return 'ok';
      } catch (e) {
        return rejected(e, 'config.json', [f]);
      }
    },
  };

  // ------------------------------------------------------------ run configs (objects, JSON and YAML files)
  const runSeed = {
    model: { path: 'models/x', threads: 1 },
    data: { train: 'train.jsonl', validLimit: 8 },
    rollout: { budget: 8, initialSamples: 4, entropyWindow: 4, maxResponseTokens: 64 },
    tools: { python: { timeoutMs: 3000, isolation: 'full' }, concurrency: 2 },
    optim: { lr: 1e-4 },
    train: { steps: 3, batchPrompts: 2, packing: 'tree', deterministic: false },
  };
  const runConfig: FuzzTarget = {
    name: 'run config (object, JSON, YAML)',
    run(seed, index) {
      const rng = caseRng(seed, index);
      const kind = rng.int(0, 2);
      const file = kind === 1 ? path.join(dir, 'run.json') : path.join(dir, 'run.yaml');
      try {
        if (kind === 0) validateConfig(mutateJson(rng, runSeed), 'run config');
        else if (kind === 1) {
          fs.writeFileSync(file, mutateJsonText(rng, runSeed));
          loadConfig(file);
        } else {
          fs.writeFileSync(file, yamlOf(rng, mutateJson(rng, runSeed)));
          loadConfig(file);
        }
        return 'ok';
      } catch (e) {
        return rejected(e, 'run config', kind === 0 ? ['run config'] : [path.basename(file)]);
      }
    },
  };

  // ------------------------------------------------------------ JSONL dataset rows
  const rowSeed = { data_source: 'demo', prompt: [{ role: 'user', content: 'What is 2 + 2?' }], reward_model: { ground_truth: '4' }, ability: 'math', extra_info: { index: 1 } };
  const jsonl: FuzzTarget = {
    name: 'JSONL dataset rows',
    async run(seed, index) {
      const rng = caseRng(seed, index);
      const lines: string[] = [];
      for (let i = 0; i < 4; i++) lines.push(rng.next() < 0.5 ? JSON.stringify(rowSeed) : rng.next() < 0.5 ? JSON.stringify(mutateJson(rng, rowSeed)) ?? 'null' : mutateJsonText(rng, rowSeed));
      const f = w('rows.jsonl', lines.join('\n'));
      const policy = rng.next() < 0.5 ? 'fail' : 'skip';
      try {
        const ds = await PromptDataset.load(f, { onMalformed: policy });
        for (const ex of ds.examples) if (typeof ex.question !== 'string' || ex.question.length === 0 || !(typeof ex.groundTruth === 'string' || Array.isArray(ex.groundTruth))) throw new Error('dataset: accepted an example without a question or a ground truth');
        return 'ok';
      } catch (e) {
        return rejected(e, 'jsonl', [f]);
      }
    },
  };

  // ------------------------------------------------------------ parquet dataset rows
  // The seed is the reference's smallest real RL dataset (103 rows): no parquet
  // writer ships with hyparquet, and a real file exercises what users load.
  // Half the cases edit the footer (the thrift FileMetaData: schema, row
  // groups, column chunk offsets and sizes, page counts), fixing its length
  // field half of those times so the reader gets past the framing.
  const parquetSeedFile = path.join(__dirname, '..', '..', '..', 'shared', 'data', 'arpo', 'gaia_test.parquet');
  const parquetSeed = fs.existsSync(parquetSeedFile) ? fs.readFileSync(parquetSeedFile) : undefined;
  const parquet: FuzzTarget = {
    name: 'parquet dataset rows',
    skip: parquetSeed ? undefined : `no seed file ${parquetSeedFile} (the reference's datasets are not on this machine)`,
    async run(seed, index) {
      const rng = caseRng(seed, index);
      const buf = parquetSeed as Buffer;
      let bytes: Buffer;
      if (rng.next() < 0.5) {
        bytes = mutateBytes(rng, buf);
      } else {
        const metaLen = buf.readUInt32LE(buf.length - 8);
        const start = buf.length - 8 - metaLen;
        const meta = mutateBytes(rng, buf.subarray(start, buf.length - 8));
        const tail = Buffer.from(buf.subarray(buf.length - 8));
        if (rng.next() < 0.5) tail.writeUInt32LE(meta.length, 0);
        bytes = Buffer.concat([buf.subarray(0, start), meta, tail]);
      }
      const f = w('rows.parquet', bytes);
      try {
        const ds = await PromptDataset.load(f, { onMalformed: rng.next() < 0.5 ? 'fail' : 'skip' });
        for (const ex of ds.examples) if (typeof ex.question !== 'string' || ex.question.length === 0 || !(typeof ex.groundTruth === 'string' || Array.isArray(ex.groundTruth))) throw new Error('parquet: accepted an example without a question or a ground truth');
        return 'ok';
      } catch (e) {
        return rejected(e, 'parquet', [f]);
      }
    },
  };

  // ------------------------------------------------------------ the tool-call protocol parser
  const transcript = 'I will look it up.\n<search> capital of France </search>\n<result>\nParis is the capital.\n</result>\nNow compute: <python>print(2 + 2)</python>';
  const protocol: FuzzTarget = {
    name: 'tool-call protocol parser',
    run(seed, index) {
      const rng = caseRng(seed, index);
      const bytes = mutateBytes(rng, Buffer.from(transcript, 'utf8'));
      const input = rng.next() < 0.5 ? new Uint8Array(bytes) : bytes.toString('utf8');
      const r = parseToolCall(input); // never throws for text: a model writes anything
      if (r.kind === 'call' && typeof r.content !== 'string') throw new Error('protocol: a call without string content');
      return 'ok';
    },
  };

  // ------------------------------------------------------------ MCP tool replies
  const replySeed = { content: [{ type: 'text', text: 'hello' }, { type: 'resource', resource: { uri: 'file:///a', text: 'doc' } }, { type: 'image', mimeType: 'image/png', data: 'AAAA' }], isError: false };
  const mcpReply: FuzzTarget = {
    name: 'MCP tool replies',
    run(seed, index) {
      const rng = caseRng(seed, index);
      const reply = mutateJson(rng, replySeed);
      try {
        const t = resultText(reply as Parameters<typeof resultText>[0]);
        if (typeof t !== 'string') throw new Error('mcp: resultText returned a non-string');
        return 'ok';
      } catch (e) {
        return rejected(e, 'mcp reply', ['MCP']);
      }
    },
  };

  // ------------------------------------------------------------ tokenizer.json / tokenizer_config.json
  const tokDir = path.join(dir, 'tok');
  fs.mkdirSync(tokDir, { recursive: true });
  writeTokenizerFiles(tokDir, buildTinyBpeTokenizer(['search', 'answer', 'Paris']));
  const tokSeed = JSON.parse(fs.readFileSync(path.join(tokDir, 'tokenizer.json'), 'utf8')) as unknown;
  const tokCfgSeed = JSON.parse(fs.readFileSync(path.join(tokDir, 'tokenizer_config.json'), 'utf8')) as unknown;
  const tokenizer: FuzzTarget = {
    name: 'tokenizer.json / tokenizer_config.json',
    run(seed, index) {
      const rng = caseRng(seed, index);
      const which = rng.next() < 0.5 ? 'tokenizer.json' : 'tokenizer_config.json';
      const seedValue = which === 'tokenizer.json' ? tokSeed : tokCfgSeed;
      const f = path.join(tokDir, which);
      const orig = fs.readFileSync(f);
      fs.writeFileSync(f, rng.next() < 0.6 ? JSON.stringify(mutateJson(rng, seedValue)) ?? 'null' : mutateJsonText(rng, seedValue));
      try {
        const tok = Tokenizer.fromDir(tokDir);
        const ids = tok.encode('search Paris');
        tok.decode(ids);
        return 'ok';
      } catch (e) {
        return rejected(e, 'tokenizer', [tokDir]);
      } finally {
        fs.writeFileSync(f, orig);
      }
    },
  };

  // ------------------------------------------------------------ replay-cache rows
  const cacheFile = path.join(dir, 'replay.sqlite');
  const key = callKey('python', 'k', 'print(1)');
  ToolCallCache.open(cacheFile).close();
  const raw = new Database(cacheFile);
  const columns = ['input', 'text', 'ok', 'meta', 'ms', 'created_at'] as const;
  const seedRow = { input: 'print(1)', text: '1', ok: 1, meta: JSON.stringify({ isolation: 'isolation=full', exitCode: 0 }), ms: 12.5, created_at: '2026-12-03T00:00:00.000Z' };
  const replayRows: FuzzTarget = {
    name: 'replay-cache rows',
    run(seed, index) {
      const rng = caseRng(seed, index);
      raw.prepare('DELETE FROM tool_calls').run();
      raw.prepare('INSERT INTO tool_calls (tool, key, input, text, ok, meta, ms, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)').run('python', key, seedRow.input, seedRow.text, seedRow.ok, seedRow.meta, seedRow.ms, seedRow.created_at);
      for (let e = 1 + rng.int(0, 1); e > 0; e--) {
        const col = rng.pick(columns);
        const cur = seedRow[col];
        const kind = rng.int(0, 3);
        const value =
          kind === 0 ? mutateBytes(rng, Buffer.from(String(cur), 'utf8')) // a blob
          : kind === 1 ? mutateBytes(rng, Buffer.from(String(cur), 'utf8')).toString('utf8')
          : kind === 2 ? rng.pick([0, -1, 1.5, 2 ** 62, -1e308, 1e308])
          : col === 'meta' ? mutateJsonText(rng, JSON.parse(seedRow.meta)) : String(rng.next());
        try {
          raw.prepare(`UPDATE tool_calls SET ${col} = ?`).run(value);
        } catch {
          // a NOT NULL or type constraint refused it: that row cannot exist
        }
      }
      const cache = ToolCallCache.open(cacheFile);
      try {
        const c = cache.get('python', key);
        if (!c || typeof c.text !== 'string' || typeof c.ok !== 'boolean' || !Number.isFinite(c.ms)) throw new Error(`replay: a row read back as ${JSON.stringify(c)}`);
        return 'ok';
      } catch (e) {
        return rejected(e, 'replay row', [cacheFile]);
      } finally {
        cache.close();
      }
    },
  };

  return [safetensors, shardIndex, modelConfig, runConfig, jsonl, parquet, protocol, mcpReply, tokenizer, replayRows];
}

/** A YAML rendering of `v` (flow style for leaves, sometimes broken by an edit). */
function yamlOf(rng: Rng, v: unknown): string {
  const lines: string[] = [];
  const walk = (x: unknown, indent: string): void => {
    if (x !== null && typeof x === 'object' && !Array.isArray(x)) {
      for (const [k, y] of Object.entries(x)) {
        if (y !== null && typeof y === 'object' && !Array.isArray(y)) {
          lines.push(`${indent}${k}:`);
          walk(y, `${indent}  `);
        } else lines.push(`${indent}${k}: ${JSON.stringify(y) ?? '~'}`);
      }
    } else lines.push(`${indent}${JSON.stringify(x) ?? '~'}`);
  };
  walk(v, '');
  let s = lines.join('\n');
  if (rng.next() < 0.3) s = mutateBytes(rng, Buffer.from(s, 'utf8')).toString('utf8');
  if (rng.next() < 0.1) s += `\n${lines[0] ?? 'a: 1'}`; // a duplicate key
  return s;
}

export function fuzzDir(): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-fuzz-'));
}
