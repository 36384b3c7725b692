// llama.cpp through node-llama-cpp (a dev dependency, ESM-only), run as a
// child process by the GGUF round-trip test (test/model/gguf-llama.test.ts)
// and the engine bench (bench/llama.ts), so jest's CommonJS and arpo's own
// threads stay apart from llama.cpp's. CPU only (gpu: false), never builds
// llama.cpp from source (build: 'never': the prebuilt linux-x64 binary).
// Prints one JSON object on stdout.
//
//   node bench/llama/llama-cpp.mjs greedy   <file.gguf> <ids.json> <n> [threads]
//       n greedy tokens after the prompt token ids: {"tokens": [...]}
//   node bench/llama/llama-cpp.mjs tokenize <file.gguf> <texts.json>
//       llama.cpp's token ids of each text (no BOS, specials parsed): {"ids": [[...], ...]}
//   node bench/llama/llama-cpp.mjs decode   <file.gguf> <batch> <ids.json> <steps> <threads>
//       batch sequences of one context, each prefilled with the prompt token
//       ids, then greedy decoding evaluated together; decode tokens/s counted
//       from the moment every sequence has its first token:
//       {"batch", "tokens_per_s", "ms_per_step", "tokens": first sequence's tokens}
import { getLlama } from 'node-llama-cpp';

const [mode, file, ...rest] = process.argv.slice(2);
const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error', progressLogs: false });
const model = await llama.loadModel({ modelPath: file });

async function greedy(sequence, ids, n, onToken) {
  const out = [];
  for await (const t of sequence.evaluate(ids, { temperature: 0 })) {
    out.push(Number(t));
    if (onToken) onToken(out.length);
    if (out.length >= n) break;
  }
  return out;
}

if (mode === 'greedy') {
  const [idsJson, n, threads] = rest;
  const ids = JSON.parse(idsJson);
  const context = await model.createContext({ contextSize: ids.length + Number(n) + 16, threads: Number(threads ?? 1) });
  const tokens = await greedy(context.getSequence(), ids, Number(n));
  console.log(JSON.stringify({ tokens }));
} else if (mode === 'tokenize') {
  const texts = JSON.parse(rest[0]);
  console.log(JSON.stringify({ ids: texts.map((t) => Array.from(model.tokenize(t, true), Number)) }));
} else if (mode === 'decode') {
  const ids = JSON.parse(rest[1]);
  const [batch, , steps, threads] = rest.map(Number);
  const prompt = ids.length;
  const context = await model.createContext({
    sequences: batch,
    contextSize: batch * (prompt + steps + 8),
    batchSize: Math.max(512, batch * 2),
    threads,
  });
  let first = 0;
  let tFirst = 0;
  const sequences = Array.from({ length: batch }, () => context.getSequence());
  const results = await Promise.all(
    sequences.map((s) =>
      greedy(s, ids, steps + 1, (k) => {
        if (k === 1 && ++first === batch) tFirst = performance.now();
      }),
    ),
  );
  const seconds = (performance.now() - tFirst) / 1000;
  console.log(JSON.stringify({ batch, steps, tokens_per_s: (batch * steps) / seconds, ms_per_step: (1000 * seconds) / steps, tokens: results[0] }));
} else {
  console.error(`llama-cpp.mjs: unknown mode ${mode}`);
  process.exit(2);
}
await model.dispose();
