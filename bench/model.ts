// Policy-model numbers: KV memory of 8 forks of a 1,000-token path vs 8
// private copies (block-pool accounting), and decode tokens/s at batch 1 and
// 64 for a small config (hidden 256, 4 layers, vocab 32k), plus a train step,
// in float32 and in bfloat16 (bf16 weights and activations, float32 master
// weights and AdamW state: issue 18), side by side in one run.
//
//   npx ts-node --transpile-only bench/model.ts [--threads 2] [--steps 16] [--prompt 128] [--json out.json]
//
// Needs the full addon (ARPO_ADDON=/path/to/arpo.node to pick a build).
import * as fs from 'fs';
import { tinyConfig } from '../lib/model/checkpoint';
import { PolicyModel, type ComputeDType } from '../lib/model/policy-model';

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] !== undefined ? (process.argv[i + 1] as string) : fallback;
}

const threads = Number(arg('threads', '2'));
const steps = Number(arg('steps', '16'));
const promptLen = Number(arg('prompt', '128'));
const mib = (b: number): string => `${(b / 2 ** 20).toFixed(2)} MiB`;

async function forkMemory(): Promise<Record<string, number>> {
  const model = await PolicyModel.create(tinyConfig('qwen2', { vocab_size: 32000, hidden_size: 256, intermediate_size: 768, num_hidden_layers: 4, num_attention_heads: 8, num_key_value_heads: 2, max_position_embeddings: 4096 }), { threads, seed: 1 });
  const root = model.newPath(0);
  await model.extend([root], [Int32Array.from({ length: 1000 }, (_, i) => (i * 7919) % 32000)], { temperature: 1, seed: 1 });
  const forks = Array.from({ length: 8 }, (_, i) => model.fork(root, 1000, i + 1));
  await model.extend(forks, forks.map((_, i) => Int32Array.of(i)), { temperature: 1, seed: 1 }); // each fork writes one token
  model.freePath(root);
  const s = model.cacheStats();
  model.dispose();
  console.log(`8 forks of a 1,000-token path (each + 1 own token): ${mib(s.bytesUsed)} in ${s.blocksUsed} blocks of ${s.blockSize} tokens`);
  console.log(`  vs 8 private copies: ${mib(s.bytesUnshared)} (${(s.bytesUnshared / s.bytesUsed).toFixed(2)}x)`);
  return { forkBytes: s.bytesUsed, copyBytes: s.bytesUnshared, blocksUsed: s.blocksUsed };
}

async function decodeSpeed(batch: number, dtype: ComputeDType): Promise<number> {
  const model = await PolicyModel.create(tinyConfig('qwen2', { vocab_size: 32000, hidden_size: 256, intermediate_size: 768, num_hidden_layers: 4, num_attention_heads: 8, num_key_value_heads: 2, max_position_embeddings: 4096 }), { threads, seed: 2, dtype });
  const paths = Array.from({ length: batch }, (_, i) => model.newPath(i));
  const sampling = { temperature: 1, seed: 7 };
  let r = await model.extend(paths, paths.map((_, i) => Int32Array.from({ length: promptLen }, (_, t) => (t * 31 + i) % 32000)), sampling);
  const t0 = process.hrtime.bigint();
  for (let s = 0; s < steps; s++) r = await model.extend(paths, paths.map((_, i) => Int32Array.of(r.tokens[i]!)), sampling);
  const sec = Number(process.hrtime.bigint() - t0) / 1e9;
  model.dispose();
  const tps = (batch * steps) / sec;
  console.log(`${dtype} decode batch ${batch}: ${tps.toFixed(1)} tokens/s (${((sec / steps) * 1000).toFixed(1)} ms per step, context ${promptLen}..${promptLen + steps})`);
  return tps;
}

async function trainSpeed(dtype: ComputeDType): Promise<number> {
  const model = await PolicyModel.create(tinyConfig('qwen2', { vocab_size: 32000, hidden_size: 256, intermediate_size: 768, num_hidden_layers: 4, num_attention_heads: 8, num_key_value_heads: 2, max_position_embeddings: 4096 }), { threads, seed: 3, dtype });
  const seqs = Array.from({ length: 4 }, (_, i) => Int32Array.from({ length: 256 }, (_, t) => (t * 131 + i) % 32000));
  const old = await model.logprobs(seqs);
  const batch = seqs.map((tokens, i) => ({ tokens, mask: Array.from(tokens, (_, t) => (t >= 64 ? 1 : 0)), oldLogprobs: old.logprobs[i]!, advantages: Array.from(tokens, () => (i % 2 ? 1 : -1)) }));
  await model.trainStep([batch], { optimizer: { lr: 1e-4 } });
  const t0 = process.hrtime.bigint();
  const n = 3;
  for (let s = 0; s < n; s++) await model.trainStep([batch], { optimizer: { lr: 1e-4 } });
  const sec = Number(process.hrtime.bigint() - t0) / 1e9 / n;
  model.dispose();
  console.log(`${dtype} train step (4 x 256 tokens, V 32k, fused loss + AdamW): ${(sec * 1000).toFixed(0)} ms, ${((4 * 256) / sec).toFixed(0)} tokens/s`);
  return sec;
}

async function main(): Promise<void> {
  console.log(`threads ${threads}; config qwen2 hidden 256, 4 layers, 8 heads / 2 kv heads, vocab 32000`);
  const memory = await forkMemory();
  const result: Record<string, unknown> = { threads, memory };
  for (const dtype of ['float32', 'bfloat16'] as const) {
    const b1 = await decodeSpeed(1, dtype);
    const b64 = await decodeSpeed(64, dtype);
    const train = await trainSpeed(dtype);
    result[dtype] = { decodeTokensPerSecond: { batch1: b1, batch64: b64 }, trainStepSeconds: train, trainTokensPerSecond: (4 * 256) / train };
  }
  const f = result.float32 as { decodeTokensPerSecond: { batch1: number; batch64: number }; trainTokensPerSecond: number };
  const b = result.bfloat16 as typeof f;
  console.log(`bf16 / float32: decode batch 1 ${(b.decodeTokensPerSecond.batch1 / f.decodeTokensPerSecond.batch1).toFixed(2)}x, batch 64 ${(b.decodeTokensPerSecond.batch64 / f.decodeTokensPerSecond.batch64).toFixed(2)}x, train ${(b.trainTokensPerSecond / f.trainTokensPerSecond).toFixed(2)}x`);
  const out = arg('json', '');
  if (out) fs.writeFileSync(out, JSON.stringify(result, null, 2));
}

void main();
