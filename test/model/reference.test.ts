// Sanity of the float64 reference forward (test/model/reference.ts) before it
// judges the native model: a 1-layer case worked out with scalar formulas,
// causality, GQA == MHA with repeated kv heads, tied == copied embeddings,
// llama3 rope frequencies by hand, rotary relative-position invariance.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { parseModelConfig, tinyConfig, writeCheckpointDir } from '../../lib/model/checkpoint';
import { float64ToBytes, writeSafetensors } from '../../lib/model/safetensors';
import { initModel } from '../../lib/cli/init-model';
import { applyRotary, loadReferenceModel, referenceForward, ropeInvFreq, type ReferenceModel } from './reference';

let dir: string;
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-ref-'));
});
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

async function writeModel(name: string, config: Record<string, unknown>, tensors: Record<string, { shape: number[]; values: number[] }>): Promise<string> {
  const out = path.join(dir, name);
  await writeCheckpointDir(out, {
    config,
    writeWeights: (staging) =>
      writeSafetensors(
        path.join(staging, 'model.safetensors'),
        Object.entries(tensors).map(([n, t]) => ({ name: n, dtype: 'F64' as const, shape: t.shape, data: float64ToBytes('F64', t.values) })),
      ),
  });
  return out;
}

function maxAbsDiff(a: Float64Array, b: Float64Array): number {
  expect(a.length).toBe(b.length);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}

test.each(['qwen2', 'qwen3'] as const)('1-layer %s (H = 2, one head of dim 2, V = 3, T = 2) equals the formulas worked out by hand', async (type) => {
  const eps = 1e-6;
  const w = {
    embed: [0.5, -1.0, 1.5, 0.25, -0.75, 2.0], // (V=3, H=2)
    ln1: [1.1, 0.9], q: [0.3, -0.2, 0.1, 0.4], qb: [0.05, -0.1], k: [-0.5, 0.2, 0.3, 0.6], kb: [0.2, 0.0],
    v: [0.7, 0.1, -0.3, 0.5], vb: [0.0, 0.3], o: [0.9, -0.4, 0.2, 1.2], ln2: [0.8, 1.2],
    gate: [0.5, -0.6, 0.4, 0.3], up: [-0.2, 0.7, 1.0, 0.1], down: [0.6, -0.3, 0.25, 0.8], norm: [1.3, 0.7],
    head: [0.2, -0.5, 1.0, 0.3, -0.7, 0.9], qn: [1.4, 0.6], kn: [0.7, 1.5],
  };
  const qwen3 = type === 'qwen3';
  // qwen2: q/k/v biases; qwen3: no biases but per-head RMSNorm of q and k before rotary.
  const zero = [0, 0];
  const config = { ...tinyConfig(type), head_dim: 2, vocab_size: 3, hidden_size: 2, intermediate_size: 2, num_hidden_layers: 1, num_attention_heads: 1, num_key_value_heads: 1, rope_theta: 10000, rms_norm_eps: eps };
  const out = await writeModel(`hand-${type}`, config, {
    'model.embed_tokens.weight': { shape: [3, 2], values: w.embed },
    'model.layers.0.input_layernorm.weight': { shape: [2], values: w.ln1 },
    'model.layers.0.self_attn.q_proj.weight': { shape: [2, 2], values: w.q },
    'model.layers.0.self_attn.k_proj.weight': { shape: [2, 2], values: w.k },
    'model.layers.0.self_attn.v_proj.weight': { shape: [2, 2], values: w.v },
    ...(qwen3
      ? {
          'model.layers.0.self_attn.q_norm.weight': { shape: [2], values: w.qn },
          'model.layers.0.self_attn.k_norm.weight': { shape: [2], values: w.kn },
        }
      : {
          'model.layers.0.self_attn.q_proj.bias': { shape: [2], values: w.qb },
          'model.layers.0.self_attn.k_proj.bias': { shape: [2], values: w.kb },
          'model.layers.0.self_attn.v_proj.bias': { shape: [2], values: w.vb },
        }),
    'model.layers.0.self_attn.o_proj.weight': { shape: [2, 2], values: w.o },
    'model.layers.0.post_attention_layernorm.weight': { shape: [2], values: w.ln2 },
    'model.layers.0.mlp.gate_proj.weight': { shape: [2, 2], values: w.gate },
    'model.layers.0.mlp.up_proj.weight': { shape: [2, 2], values: w.up },
    'model.layers.0.mlp.down_proj.weight': { shape: [2, 2], values: w.down },
    'model.norm.weight': { shape: [2], values: w.norm },
    'lm_head.weight': { shape: [3, 2], values: w.head },
  });
  const ids = [2, 0];
  const got = referenceForward(loadReferenceModel(out), ids);

  // By hand, 2-vectors throughout. W is (out, in) row-major: (Wx)_o = W[o][0] x0 + W[o][1] x1.
  type V2 = [number, number];
  const mv = (W: number[], x: V2, b: number[] = [0, 0]): V2 => [W[0]! * x[0] + W[1]! * x[1] + b[0]!, W[2]! * x[0] + W[3]! * x[1] + b[1]!];
  const rms = (x: V2, g: number[]): V2 => {
    const r = 1 / Math.sqrt((x[0] ** 2 + x[1] ** 2) / 2 + eps);
    return [x[0] * r * g[0]!, x[1] * r * g[1]!];
  };
  // head_dim 2: one frequency, inv_freq = 1/theta^0 = 1, so position p rotates by p radians.
  const rot = (x: V2, p: number): V2 => [x[0] * Math.cos(p) - x[1] * Math.sin(p), x[1] * Math.cos(p) + x[0] * Math.sin(p)];
  const silu = (z: number): number => z / (1 + Math.exp(-z));
  const xs: V2[] = ids.map((id) => [w.embed[2 * id]!, w.embed[2 * id + 1]!]);
  const hs = xs.map((x) => rms(x, w.ln1));
  const qs = hs.map((h, p) => rot(qwen3 ? rms(mv(w.q, h), w.qn) : mv(w.q, h, w.qb), p));
  const ks = hs.map((h, p) => rot(qwen3 ? rms(mv(w.k, h), w.kn) : mv(w.k, h, w.kb), p));
  const vs = hs.map((h) => mv(w.v, h, qwen3 ? zero : w.vb));
  const dot = (a: V2, b: V2): number => a[0] * b[0] + a[1] * b[1];
  // t = 0 attends only to itself; t = 1 softmax over its two scores / sqrt(2).
  const s10 = dot(qs[1]!, ks[0]!) / Math.SQRT2;
  const s11 = dot(qs[1]!, ks[1]!) / Math.SQRT2;
  const p0 = Math.exp(s10) / (Math.exp(s10) + Math.exp(s11));
  const attn: V2[] = [vs[0]!, [p0 * vs[0]![0] + (1 - p0) * vs[1]![0], p0 * vs[0]![1] + (1 - p0) * vs[1]![1]]];
  const expected: number[] = [];
  for (let t = 0; t < 2; t++) {
    const o = mv(w.o, attn[t]!);
    const x1: V2 = [xs[t]![0] + o[0], xs[t]![1] + o[1]];
    const h2 = rms(x1, w.ln2);
    const g = mv(w.gate, h2);
    const u = mv(w.up, h2);
    const d = mv(w.down, [silu(g[0]) * u[0], silu(g[1]) * u[1]]);
    const fin = rms([x1[0] + d[0], x1[1] + d[1]], w.norm);
    for (let vtok = 0; vtok < 3; vtok++) expected.push(w.head[2 * vtok]! * fin[0] + w.head[2 * vtok + 1]! * fin[1]);
  }
  expect(maxAbsDiff(got, Float64Array.from(expected))).toBeLessThan(1e-14);
});

describe('tiny random models', () => {
  const models: Record<string, ReferenceModel> = {};
  beforeAll(async () => {
    for (const type of ['qwen2', 'qwen3', 'llama'] as const) {
      const out = path.join(dir, type);
      await initModel({ config: tinyConfig(type, { initializer_range: 0.3 }), out, seed: 11 });
      models[type] = loadReferenceModel(out);
    }
  });

  test.each(['qwen2', 'qwen3', 'llama'])('%s: causal (a prefix gets the same logits), finite, input-dependent', (type) => {
    const m = models[type]!;
    const ids = [5, 17, 3, 90, 41, 41, 8];
    const full = referenceForward(m, ids);
    const prefix = referenceForward(m, ids.slice(0, 4));
    const V = m.config.vocabSize;
    expect(maxAbsDiff(full.subarray(0, 4 * V), prefix)).toBe(0);
    expect(full.every(Number.isFinite)).toBe(true);
    // Changing a later token changes only later rows.
    const changed = referenceForward(m, [5, 17, 3, 90, 7, 41, 8]);
    expect(maxAbsDiff(full.subarray(0, 4 * V), changed.subarray(0, 4 * V))).toBe(0);
    expect(maxAbsDiff(full.subarray(4 * V), changed.subarray(4 * V))).toBeGreaterThan(1e-3);
  });

  test('GQA (4 heads over 2 kv heads) equals MHA with each kv head repeated (HF repeat_kv order)', () => {
    const m = models.qwen2!;
    const c = m.config;
    const hd = c.headDim;
    const group = c.numAttentionHeads / c.numKeyValueHeads;
    const weights = new Map(m.weights);
    for (let l = 0; l < c.numHiddenLayers; l++) {
      for (const proj of ['k_proj', 'v_proj']) {
        for (const kind of ['weight', 'bias']) {
          const name = `model.layers.${l}.self_attn.${proj}.${kind}`;
          const src = m.weights.get(name)!;
          const rowLen = kind === 'weight' ? c.hiddenSize : 1;
          const dst = new Float64Array(c.numAttentionHeads * hd * rowLen);
          for (let h = 0; h < c.numAttentionHeads; h++) {
            const kvh = Math.floor(h / group);
            dst.set(src.subarray(kvh * hd * rowLen, (kvh + 1) * hd * rowLen), h * hd * rowLen);
          }
          weights.set(name, dst);
        }
      }
    }
    const mha: ReferenceModel = { config: { ...c, numKeyValueHeads: c.numAttentionHeads }, weights };
    const ids = [1, 2, 3, 60, 61, 4];
    expect(maxAbsDiff(referenceForward(m, ids), referenceForward(mha, ids))).toBeLessThan(1e-12);
  });

  test('tied embeddings equal an untied model whose lm_head is a copy of the embeddings', () => {
    const m = models.qwen3!;
    const tied: ReferenceModel = { config: { ...m.config, tieWordEmbeddings: true }, weights: m.weights };
    const weights = new Map(m.weights);
    weights.set('lm_head.weight', m.weights.get('model.embed_tokens.weight')!);
    const untied: ReferenceModel = { config: m.config, weights };
    const ids = [9, 8, 7];
    expect(maxAbsDiff(referenceForward(tied, ids), referenceForward(untied, ids))).toBe(0);
  });
});

test('llama3 rope frequencies by hand (theta 500000, head_dim 8, factor 8, original 256)', () => {
  const c = parseModelConfig(tinyConfig('llama'));
  const inv = ropeInvFreq(c);
  const base = [0, 1, 2, 3].map((i) => 500000 ** (-(2 * i) / 8));
  // Wavelengths 2*pi/f: 6.28 (< 256/4 = 64: kept), 166.6 (in [64, 256]: interpolated), 4.4e3 and 1.2e5 (> 256: divided by 8).
  const smooth = (256 / ((2 * Math.PI) / base[1]!) - 1) / (4 - 1);
  const expected = [base[0]!, (1 - smooth) * (base[1]! / 8) + smooth * base[1]!, base[2]! / 8, base[3]! / 8];
  for (let i = 0; i < 4; i++) expect(Math.abs(inv[i]! - expected[i]!)).toBeLessThanOrEqual(1e-15 * expected[i]!);
  expect(smooth).toBeGreaterThan(0);
  expect(smooth).toBeLessThan(1);
});

test('rotary: q.k depends only on the position difference', () => {
  const d = 8;
  const inv = Float64Array.from([1, 0.3, 0.05, 0.001]);
  const q0 = Float64Array.from([0.3, -1, 0.5, 2, -0.7, 0.1, 1.2, -0.4]);
  const k0 = Float64Array.from([1.1, 0.2, -0.3, 0.8, 0.5, -1.5, 0.25, 0.6]);
  const dotAt = (pq: number, pk: number): number => {
    const q = q0.slice();
    const k = k0.slice();
    applyRotary(q, 1, 1, d, inv, [pq]);
    applyRotary(k, 1, 1, d, inv, [pk]);
    return q.reduce((a, x, i) => a + x * k[i]!, 0);
  };
  expect(Math.abs(dotAt(5, 2) - dotAt(105, 102))).toBeLessThan(1e-12);
  expect(Math.abs(dotAt(5, 2) - dotAt(5, 3))).toBeGreaterThan(1e-3);
});
