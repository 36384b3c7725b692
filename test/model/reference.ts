// Float64 reference forward of the Qwen2 / Qwen3 / Llama decoders, written
// from the Hugging Face definitions (modeling_qwen2/qwen3/llama.py) with plain
// loops, to check the native libtorch model against. Slow; toy sizes only.
import { expectedTensorShapes, readModelConfig, type ModelConfig } from '../../lib/model/checkpoint';
import { openCheckpointTensors } from '../../lib/model/safetensors';

export interface ReferenceModel {
  readonly config: ModelConfig;
  /** HF tensor name -> row-major float64 values. */
  readonly weights: ReadonlyMap<string, Float64Array>;
}

/** Reads a checkpoint directory (config.json + safetensors) into float64, checking every expected tensor and shape. */
export function loadReferenceModel(dir: string): ReferenceModel {
  const { config } = readModelConfig(dir);
  const stored = openCheckpointTensors(dir);
  const weights = new Map<string, Float64Array>();
  for (const [name, shape] of expectedTensorShapes(config)) {
    const entry = stored.get(name);
    if (!entry) throw new Error(`${dir}: checkpoint lacks tensor ${name}`);
    if (entry.info.shape.join(',') !== shape.join(',')) {
      throw new Error(`${dir}: tensor ${name} has shape [${entry.info.shape}] but the config needs [${shape}]`);
    }
    weights.set(name, entry.file.loadFloat64(name));
  }
  return { config, weights };
}

function weight(model: ReferenceModel, name: string): Float64Array {
  const w = model.weights.get(name);
  if (!w) throw new Error(`reference model lacks ${name}`);
  return w;
}

/** y = x W^T (+ b): x (T, in), W (out, in) as stored by nn.Linear. */
export function linear(x: Float64Array, T: number, inDim: number, W: Float64Array, outDim: number, b?: Float64Array): Float64Array {
  const y = new Float64Array(T * outDim);
  for (let t = 0; t < T; t++) {
    for (let o = 0; o < outDim; o++) {
      let s = b ? b[o]! : 0;
      for (let i = 0; i < inDim; i++) s += x[t * inDim + i]! * W[o * inDim + i]!;
      y[t * outDim + o] = s;
    }
  }
  return y;
}

/** RMSNorm over rows of width D: x * rsqrt(mean(x^2) + eps) * w (HF LlamaRMSNorm / Qwen2RMSNorm). */
export function rmsNorm(x: Float64Array, rows: number, D: number, w: Float64Array, eps: number): Float64Array {
  const y = new Float64Array(rows * D);
  for (let r = 0; r < rows; r++) {
    let ss = 0;
    for (let i = 0; i < D; i++) ss += x[r * D + i]! ** 2;
    const inv = 1 / Math.sqrt(ss / D + eps);
    for (let i = 0; i < D; i++) y[r * D + i] = x[r * D + i]! * inv * w[i]!;
  }
  return y;
}

/**
 * Rotary inverse frequencies inv_freq[i] = 1 / theta^(2i / d), i < d/2, with
 * HF's rope scaling: linear divides by factor; llama3
 * (`_compute_llama3_parameters`) divides low frequencies (wavelength >
 * original_max / low_freq_factor) by factor, keeps high ones (wavelength <
 * original_max / high_freq_factor), and interpolates in between.
 */
export function ropeInvFreq(config: ModelConfig): Float64Array {
  const d = config.headDim;
  const inv = new Float64Array(d / 2);
  for (let i = 0; i < d / 2; i++) inv[i] = 1 / config.ropeTheta ** ((2 * i) / d);
  const s = config.ropeScaling;
  if (s.type === 'linear') {
    for (let i = 0; i < inv.length; i++) inv[i] = inv[i]! / s.factor;
  } else if (s.type === 'llama3') {
    const lowFreqWavelen = s.originalMaxPositionEmbeddings / s.lowFreqFactor;
    const highFreqWavelen = s.originalMaxPositionEmbeddings / s.highFreqFactor;
    for (let i = 0; i < inv.length; i++) {
      const f = inv[i]!;
      const wavelen = (2 * Math.PI) / f;
      if (wavelen > lowFreqWavelen) {
        inv[i] = f / s.factor;
      } else if (wavelen >= highFreqWavelen) {
        const smooth = (s.originalMaxPositionEmbeddings / wavelen - s.lowFreqFactor) / (s.highFreqFactor - s.lowFreqFactor);
        inv[i] = (1 - smooth) * (f / s.factor) + smooth * f;
      }
    }
  }
  return inv;
}

/**
 * In-place rotary embedding of rows laid out (T, heads, d) at positions
 * 0..T-1: x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1),
 * cos/sin over cat(freqs, freqs) (HF apply_rotary_pos_emb).
 */
export function applyRotary(x: Float64Array, T: number, heads: number, d: number, invFreq: Float64Array, positions?: readonly number[]): void {
  const half = d / 2;
  for (let t = 0; t < T; t++) {
    const pos = positions ? positions[t]! : t;
    for (let h = 0; h < heads; h++) {
      const base = (t * heads + h) * d;
      for (let i = 0; i < half; i++) {
        const angle = pos * invFreq[i]!;
        const c = Math.cos(angle);
        const s = Math.sin(angle);
        const x1 = x[base + i]!;
        const x2 = x[base + half + i]!;
        x[base + i] = x1 * c - x2 * s;
        x[base + half + i] = x2 * c + x1 * s;
      }
    }
  }
}

const silu = (z: number): number => z / (1 + Math.exp(-z));

/** Logits (T, V), row-major float64, of the token sequence `ids` (positions 0..T-1). */
export function referenceForward(model: ReferenceModel, ids: readonly number[]): Float64Array {
  const c = model.config;
  const T = ids.length;
  const { hiddenSize: H, intermediateSize: I, vocabSize: V, headDim: hd, numAttentionHeads: nh, numKeyValueHeads: nkv } = c;
  const qDim = nh * hd;
  const kvDim = nkv * hd;
  const group = nh / nkv; // GQA: query head h reads kv head floor(h / group) (HF repeat_kv)
  const invFreq = ropeInvFreq(c);
  const eps = c.rmsNormEps;

  const embed = weight(model, 'model.embed_tokens.weight');
  let x: Float64Array = new Float64Array(T * H);
  ids.forEach((id, t) => {
    if (!Number.isInteger(id) || id < 0 || id >= V) throw new Error(`token id ${id} outside [0, ${V})`);
    x.set(embed.subarray(id * H, (id + 1) * H), t * H);
  });

  for (let l = 0; l < c.numHiddenLayers; l++) {
    const p = `model.layers.${l}`;
    const opt = (name: string, on: boolean): Float64Array | undefined => (on ? weight(model, name) : undefined);
    const h = rmsNorm(x, T, H, weight(model, `${p}.input_layernorm.weight`), eps);
    let q = linear(h, T, H, weight(model, `${p}.self_attn.q_proj.weight`), qDim, opt(`${p}.self_attn.q_proj.bias`, c.qkvBias));
    let k = linear(h, T, H, weight(model, `${p}.self_attn.k_proj.weight`), kvDim, opt(`${p}.self_attn.k_proj.bias`, c.qkvBias));
    const v = linear(h, T, H, weight(model, `${p}.self_attn.v_proj.weight`), kvDim, opt(`${p}.self_attn.v_proj.bias`, c.qkvBias));
    if (c.qkNorm) {
      // Qwen3: RMSNorm over head_dim of every head, before rotary.
      q = rmsNorm(q, T * nh, hd, weight(model, `${p}.self_attn.q_norm.weight`), eps);
      k = rmsNorm(k, T * nkv, hd, weight(model, `${p}.self_attn.k_norm.weight`), eps);
    }
    applyRotary(q, T, nh, hd, invFreq);
    applyRotary(k, T, nkv, hd, invFreq);

    // Causal softmax attention, scores scaled by 1 / sqrt(head_dim).
    const attn = new Float64Array(T * qDim);
    const scale = 1 / Math.sqrt(hd);
    const scores = new Float64Array(T);
    for (let head = 0; head < nh; head++) {
      const kvh = Math.floor(head / group);
      for (let t = 0; t < T; t++) {
        let max = -Infinity;
        for (let s = 0; s <= t; s++) {
          let dot = 0;
          for (let i = 0; i < hd; i++) dot += q[(t * nh + head) * hd + i]! * k[(s * nkv + kvh) * hd + i]!;
          scores[s] = dot * scale;
          if (scores[s]! > max) max = scores[s]!;
        }
        let denom = 0;
        for (let s = 0; s <= t; s++) {
          scores[s] = Math.exp(scores[s]! - max);
          denom += scores[s]!;
        }
        for (let i = 0; i < hd; i++) {
          let acc = 0;
          for (let s = 0; s <= t; s++) acc += scores[s]! * v[(s * nkv + kvh) * hd + i]!;
          attn[(t * nh + head) * hd + i] = acc / denom;
        }
      }
    }
    const o = linear(attn, T, qDim, weight(model, `${p}.self_attn.o_proj.weight`), H, opt(`${p}.self_attn.o_proj.bias`, c.outputBias));
    for (let i = 0; i < T * H; i++) x[i] = x[i]! + o[i]!;

    // SwiGLU MLP: down(silu(gate(x)) * up(x)).
    const h2 = rmsNorm(x, T, H, weight(model, `${p}.post_attention_layernorm.weight`), eps);
    const gate = linear(h2, T, H, weight(model, `${p}.mlp.gate_proj.weight`), I, opt(`${p}.mlp.gate_proj.bias`, c.mlpBias));
    const up = linear(h2, T, H, weight(model, `${p}.mlp.up_proj.weight`), I, opt(`${p}.mlp.up_proj.bias`, c.mlpBias));
    for (let i = 0; i < T * I; i++) gate[i] = silu(gate[i]!) * up[i]!;
    const down = linear(gate, T, I, weight(model, `${p}.mlp.down_proj.weight`), H, opt(`${p}.mlp.down_proj.bias`, c.mlpBias));
    for (let i = 0; i < T * H; i++) x[i] = x[i]! + down[i]!;
  }

  x = rmsNorm(x, T, H, weight(model, 'model.norm.weight'), eps);
  const head = c.tieWordEmbeddings ? embed : weight(model, 'lm_head.weight');
  return linear(x, T, H, head, V);
}
