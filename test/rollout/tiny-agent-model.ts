// A tiny real policy model (lib/model PolicyModel, libtorch) over the fake
// agent's word vocabulary, with weights shaped so it writes protocol tags:
// every embedding gets a constant first coordinate, which survives RMSNorm as
// a large, nearly constant h_0, so lm_head's first column sets each token's
// base log-probability (a unigram prior with tags frequent); the other
// columns, scaled up, make the distribution depend on the context.
import * as fs from 'fs';
import * as path from 'path';
import { tinyConfig } from '../../lib/model/checkpoint';
import type { PolicyModel as PolicyModelType } from '../../lib/model/policy-model';
import { bytesToFloat64, float64ToBytes, SafetensorsFile, writeSafetensors } from '../../lib/model/safetensors';
import { EOS, tok, VOCAB, VOCAB_SIZE } from './fake-engine';

/** Base probabilities of the protocol tokens; words share the rest, single characters get almost none. */
const TAG_PRIOR: Record<string, number> = {
  '<search>': 0.06,
  '</search>': 0.07,
  '<python>': 0.04,
  '</python>': 0.06,
  '<answer>': 0.004,
  '</answer>': 0.012,
  '<|endoftext|>': 0.002,
};

/** True when the loaded addon has the libtorch model layer (PolicyModel usable). */
export function torchAvailable(): boolean {
  try {
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    const { loadNative } = require('../../lib/native/loader') as typeof import('../../lib/native/loader');
    return loadNative().hasTorch === true;
  } catch {
    return false;
  }
}

/** Creates, reshapes and reloads the tiny agent model in `dir`. */
export async function tinyAgentModel(dir: string, seed = 1): Promise<PolicyModelType> {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const { PolicyModel } = require('../../lib/model/policy-model') as typeof import('../../lib/model/policy-model');
  const hidden = 32;
  const config = tinyConfig('qwen2', { vocab_size: VOCAB_SIZE, hidden_size: hidden, max_position_embeddings: 2048, bos_token_id: EOS, eos_token_id: EOS });
  const init = await PolicyModel.create(config, { seed, threads: 1 });
  try {
    await init.save(dir);
  } finally {
    init.dispose();
  }
  const wordMass = 1 - Object.values(TAG_PRIOR).reduce((a, b) => a + b, 0);
  const words = VOCAB.filter((s) => s.startsWith(' ') && s.length > 2 && s !== ' <result>');
  applyTokenPrior(dir, hidden, (v) => {
    const s = VOCAB[v] as string;
    return TAG_PRIOR[s] ?? (words.includes(s) ? wordMass / words.length : 1e-5);
  });
  return PolicyModel.load(dir, { threads: 1 });
}

/**
 * Rewrites the untied checkpoint in `dir` so its next-token distribution has the
 * base probabilities `prior(v)`: every embedding gets first coordinate 1 (a large,
 * nearly constant h_0 after RMSNorm) and lm_head's first column carries log p / h_0;
 * the other columns, scaled up, keep the distribution context-dependent.
 */
export function applyTokenPrior(dir: string, hidden: number, prior: (v: number) => number): void {
  const file = path.join(dir, 'model.safetensors');
  const st = SafetensorsFile.open(file);
  const tensors = [...st.tensors.entries()].map(([name, info]) => ({ name, info, values: bytesToFloat64(info.dtype, st.loadBytes(name)) }));
  if (!tensors.some((t) => t.name === 'lm_head.weight')) throw new Error(`applyTokenPrior: ${file} has no lm_head.weight (tied embeddings)`);
  const h0 = 5.6 * Math.sqrt(hidden / 32); // ≈ 1 / rms of an embedding with first coordinate 1 and the rest N(0, 0.02^2)
  for (const t of tensors) {
    const vocab = t.info.shape[0] as number;
    if (t.name === 'model.embed_tokens.weight') {
      for (let v = 0; v < vocab; v++) t.values[v * hidden] = 1;
    } else if (t.name === 'lm_head.weight') {
      for (let v = 0; v < vocab; v++) {
        t.values[v * hidden] = Math.log(prior(v)) / h0;
        for (let d = 1; d < hidden; d++) t.values[v * hidden + d] = (t.values[v * hidden + d] as number) * 60; // context dependence: logit noise ~ 1
      }
    }
  }
  writeSafetensors(
    file,
    tensors.map((t) => ({ name: t.name, dtype: t.info.dtype, shape: t.info.shape, data: float64ToBytes(t.info.dtype, t.values) })),
  );
}

export { tok };

/**
 * Base probabilities for {@link applyTokenPrior} over a real tokenizer whose
 * protocol tags are single tokens (the demo's): tool tags frequent, answers
 * rare, EOS rarer, so an untrained model calls search and python often.
 */
export function toolTagPrior(tok: { encode(text: string): Int32Array; readonly vocabSize: number; readonly eosTokenId: number | null }): (v: number) => number {
  const tags: Record<string, number> = { '<search>': 0.06, '</search>': 0.07, '<python>': 0.04, '</python>': 0.06, '<answer>': 0.004, '</answer>': 0.012 };
  const tagIds = new Map(Object.entries(tags).map(([t, p]) => [tok.encode(t)[0] as number, p]));
  const eos = tok.eosTokenId ?? -1;
  const special = new Set([...Object.keys(tags), '<result>', '</result>'].map((t) => tok.encode(t)[0] as number).concat([eos]));
  const rest = 1 - [...tagIds.values()].reduce((a, b) => a + b, 0) - 0.002;
  return (v) => tagIds.get(v) ?? (v === eos ? 0.002 : special.has(v) ? 1e-5 : rest / (tok.vocabSize - special.size));
}

/**
 * A 2-layer, 32-wide random Qwen3 (float32) for a real tokenizer (the demo's),
 * written to `out` with that tokenizer; with `toolTags` its weights get
 * {@link toolTagPrior} so the untrained model calls search and python often.
 * The kill harness and the soak train it.
 */
export async function initTinyQwen3(out: string, tokenizerDir: string, seed: number, options: { toolTags?: boolean } = {}): Promise<void> {
  const { initModel } = require('../../lib/cli/init-model') as typeof import('../../lib/cli/init-model');
  const { Tokenizer } = require('../../lib/model/tokenizer') as typeof import('../../lib/model/tokenizer');
  const t = Tokenizer.fromDir(tokenizerDir);
  await initModel({
    config: {
      model_type: 'qwen3', vocab_size: t.vocabSize, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 8,
      max_position_embeddings: 1024, rms_norm_eps: 1e-6, rope_theta: 10000, tie_word_embeddings: false, torch_dtype: 'float32', bos_token_id: t.eosTokenId, eos_token_id: t.eosTokenId,
    },
    out, seed, tokenizerDir,
  });
  if (options.toolTags) applyTokenPrior(out, 32, toolTagPrior(t));
}
