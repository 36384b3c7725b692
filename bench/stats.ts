// Napkin-maths benchmark of the fused logits-stats kernel through the addon:
// 256 x 151,936 float32 logits (Qwen vocabulary), against a plain native sum
// over the same buffer (the bandwidth bound). The libtorch comparison lives in
// the C++ binary: policy_loss_torch_test --bench.
// Run: npx ts-node --transpile-only bench/stats.ts   (ARPO_ADDON=... to pick a build)
import { benchSum, logitsStats, logitsStatsAsync, sampleTokens } from '../lib/native';

const T = 256;
const V = 151936;

function bestMs(fn: () => void, reps = 7): number {
  let best = Infinity;
  for (let i = 0; i < reps; i++) {
    const t0 = process.hrtime.bigint();
    fn();
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e6);
  }
  return best;
}

async function main(): Promise<void> {
  const logits = new Float32Array(T * V);
  let s = 12345;
  for (let i = 0; i < logits.length; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    logits[i] = (s / 4294967296 - 0.5) * 12;
  }
  const targets = Int32Array.from({ length: T }, (_, t) => (t * 7919) % V);
  const gb = (T * V * 4) / 1e9;
  const hw = require('os').availableParallelism?.() ?? require('os').cpus().length;
  console.log(`logits ${T} x ${V} float32 = ${(gb * 1e3).toFixed(0)} MB`);
  for (const threads of [1, hw]) {
    const sum = bestMs(() => benchSum(logits, threads));
    const stats = bestMs(() => logitsStats(logits, T, V, { targets, threads }));
    console.log(
      `threads ${threads}: plain sum ${sum.toFixed(2)} ms (${(gb / (sum / 1e3)).toFixed(1)} GB/s) | ` +
        `fused stats ${stats.toFixed(2)} ms (${(gb / (stats / 1e3)).toFixed(1)} GB/s) | stats/sum bandwidth ${(sum / stats).toFixed(2)}`,
    );
  }
  const t0 = process.hrtime.bigint();
  await logitsStatsAsync(logits, T, V, { targets });
  console.log(`logitsStatsAsync (all threads, incl. Promise round trip): ${(Number(process.hrtime.bigint() - t0) / 1e6).toFixed(2)} ms`);
  const rows = 8;
  const decode = logits.subarray(0, rows * V);
  const streams = Array.from({ length: rows }, (_, i) => i);
  const positions = Array.from({ length: rows }, () => 100);
  for (const [label, opts] of [['temperature 1', {}], ['top-p 0.9', { topP: 0.9 }], ['top-k 50', { topK: 50 }]] as const) {
    const ms = bestMs(() => sampleTokens(decode, rows, V, { ...opts, streams, positions, threads: 1 }));
    console.log(`sampleTokens ${rows} x ${V} (${label}, 1 thread): ${ms.toFixed(2)} ms`);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
