// From scored rollout trees to tree-packed training data (ARCHITECTURE.md
// "Training on trees"): one packed tree per prompt, every shared token once,
// carrying per token the copy sums of its flattened copies, and micro-batches
// of whole trees or, for a tree over the token budget, of subtrees whose
// roots carry their ancestors as context. The numbers are those of the flat
// path (lib/train/batch.ts scoreAndAttribute + microBatches) on the
// flattened trajectories: see test/train/tree-batch.test.ts.
//
// Per token i and copy l (a trajectory through i) the flat path has mask m_l
// (the loss mask; hard attribution: times 1/d), advantage A_l (soft: the
// trajectory's Â; hard: the node's mean Â) and aggregation weight
// w_l = m_l · c_l, c_l = 1 / Σ(mask of l) for seq-mean-token-mean, else 1.
// The copy sums are Σ_{A>0} w A, Σ_{A<0} w A, Σ w and the m-weighted copy
// counts by sign, from one signed tree reduction per tree
// (arpo::kernels::tree_reduce_signed).
import { ArpoError } from '../errors';
import type { KernelAggregation } from '../native/kernels';
import { treeReduceSigned } from '../native/kernels';
import type { PolicyModel, TrainTreeBatch } from '../model/policy-model';
import type { RolloutResult, RolloutTree } from '../rollout';
import type { ScoredBatch } from './batch';
import type { TreeCopySums } from '../native/types';

/** One prompt's rollout tree in depth-first preorder, with what the policy loss needs per token. */
export interface TrainTree extends TreeCopySums {
  /** Index of its prompt in the batch (its group). */
  group: number;
  tokens: Int32Array;
  /** Per node: -1 for the root, else an earlier node. */
  parent: Int32Array;
  nodeTokens: Int32Array;
  /** (K + 1) node k owns tokens [nodeOffset[k], nodeOffset[k + 1]). */
  nodeOffset: Int32Array;
  /** Sampling log-probs (or recomputed ones); 0 where the policy did not sample the token. */
  oldLogprobs: Float32Array;
  /** Node of each trajectory's leaf, in the rollout's leaf order. */
  leafNode: Int32Array;
  /** Tokens of its flattened trajectories (Σ of path lengths; what the flat path computes). */
  flatTokens: number;
}

/** A tree micro-batch and where its tokens come from. */
export interface TreeMicroBatchPlan {
  batch: TrainTreeBatch;
  /** Per token of the batch: its tree (index into the trees given) and its index there. */
  tree: Int32Array;
  index: Int32Array;
  /** 1 where the batch carries the token's loss terms (its first appearance in the step). */
  owned: Uint8Array;
}

function isLive(t: TrainTree, i: number): boolean {
  return t.weight[i] !== 0 || t.count[i] !== 0 || t.advPos[i] !== 0 || t.advNeg[i] !== 0;
}

/** Depth-first preorder of a rollout tree (children in id order): old id per new id. */
function preorder(tree: RolloutTree): number[] {
  const order: number[] = [];
  const stack = [0];
  while (stack.length > 0) {
    const id = stack.pop()!;
    order.push(id);
    const kids = tree.nodes[id]!.children;
    for (let c = kids.length - 1; c >= 0; c--) stack.push(kids[c]!);
  }
  return order;
}

/**
 * The packed training tree of every prompt that dynamic sampling kept, with
 * the copy sums of `aggregation` (seq-mean-token-mean weighs each copy by
 * 1 / its trajectory's mask sum; the others by 1).
 */
export function buildTrainTrees(rollout: RolloutResult, scored: ScoredBatch, aggregation: KernelAggregation): TrainTree[] {
  const out: TrainTree[] = [];
  let nodeBase = 0;
  let leafBase = 0;
  for (const tree of rollout.trees) {
    const base = nodeBase;
    const lbase = leafBase;
    nodeBase += tree.nodeCount;
    leafBase += tree.leafCount;
    if (scored.dropped.has(tree.prompt) || tree.leafCount === 0) continue;
    const order = preorder(tree);
    if (order.length !== tree.nodeCount) throw new ArpoError('BAD_DATA', `rollout tree of prompt ${tree.prompt}: ${tree.nodeCount - order.length} nodes unreachable from its prompt`);
    const K = order.length;
    const newId = new Int32Array(K);
    order.forEach((old, k) => (newId[old] = k));
    const parent = new Int32Array(K);
    const nodeTokens = new Int32Array(K);
    const nodeOffset = new Int32Array(K + 1);
    order.forEach((old, k) => {
      const n = tree.nodes[old]!;
      parent[k] = n.parent < 0 ? -1 : newId[n.parent]!;
      nodeTokens[k] = n.tokens.length;
      nodeOffset[k + 1] = nodeOffset[k]! + n.tokens.length;
    });
    const N = nodeOffset[K]!;
    const tokens = new Int32Array(N);
    const oldLogprobs = new Float32Array(N);
    const mask = new Float32Array(N); // the mask of every copy (the flat path's float32 value)
    const nodeValue = new Float32Array(K);
    order.forEach((old, k) => {
      const n = tree.nodes[old]!;
      const off = nodeOffset[k]!;
      tokens.set(n.tokens, off);
      if (n.kind !== 'generated') return; // prompt and tool results: context, mask 0
      oldLogprobs.set(n.logprobs, off);
      const d = scored.attribution === 'hard' ? Math.max(1, scored.nodeLeafCounts[base + old]!) : 1;
      mask.fill(1 / d, off, off + n.tokens.length);
      nodeValue[k] = scored.nodeValues[base + old]!;
    });
    // Leaves, their advantages and aggregation weights.
    const L = tree.leafCount;
    const leafNode = new Int32Array(L);
    const leafAdv = new Float64Array(L);
    const leafWeight = new Float64Array(L);
    let flatTokens = 0;
    for (const leaf of tree.leaves) {
      const k = newId[leaf.node]!;
      leafNode[leaf.index] = k;
      leafAdv[leaf.index] = scored.attribution === 'hard' ? 1 : Math.fround(scored.items[lbase + leaf.index]!.advantage);
      let len = 0;
      let tokensOnPath = 0;
      for (let n = k; n >= 0; n = parent[n]!) {
        tokensOnPath += nodeTokens[n]!;
        for (let i = nodeOffset[n]!; i < nodeOffset[n + 1]!; i++) len += mask[i]!;
      }
      flatTokens += tokensOnPath;
      leafWeight[leaf.index] = aggregation === 'seq-mean-token-mean' ? (len > 0 ? 1 / len : 0) : 1;
    }
    const r = treeReduceSigned(parent, leafNode, leafAdv, leafWeight);
    const t: TrainTree = {
      group: tree.prompt, tokens, parent, nodeTokens, nodeOffset, oldLogprobs,
      advPos: new Float64Array(N), advNeg: new Float64Array(N), weight: new Float64Array(N),
      countPos: new Float64Array(N), countNeg: new Float64Array(N), count: new Float64Array(N),
      leafNode, flatTokens,
    };
    for (let k = 0; k < K; k++) {
      for (let i = nodeOffset[k]!; i < nodeOffset[k + 1]!; i++) {
        const m = mask[i]!;
        if (m === 0) continue;
        t.weight[i] = m * r.weightSum[k]!;
        t.count[i] = m * r.count[k]!;
        if (scored.attribution === 'soft') {
          t.advPos[i] = m * r.posSum[k]!;
          t.advNeg[i] = m * r.negSum[k]!;
          t.countPos[i] = m * r.posCount[k]!;
          t.countNeg[i] = m * r.negCount[k]!;
        } else {
          // Hard: every copy carries the node's mean, so all copies share its sign.
          const v = nodeValue[k]!;
          if (v > 0) (t.advPos[i] = v * t.weight[i]!), (t.countPos[i] = t.count[i]!);
          if (v < 0) (t.advNeg[i] = v * t.weight[i]!), (t.countNeg[i] = t.count[i]!);
        }
      }
    }
    out.push(t);
  }
  return out;
}

/** Builder of one micro-batch: a forest of (sub)trees, nodes appended in order. */
class ForestBuilder {
  tokens: number[] = [];
  parent: number[] = [];
  nodeTokens: number[] = [];
  tree: number[] = [];
  index: number[] = [];
  owned: number[] = [];
  sequences = 0;

  get size(): number {
    return this.tokens.length;
  }

  /** Appends the nodes of tree `ti` whose `keep` flag is set (closed under ancestors), in order. */
  add(t: TrainTree, ti: number, keep: Uint8Array, ownedNodes: Uint8Array): void {
    const local = new Int32Array(t.parent.length).fill(-1);
    for (let k = 0; k < t.parent.length; k++) {
      if (!keep[k]) continue;
      local[k] = this.parent.length;
      const p = t.parent[k]!;
      this.parent.push(p < 0 ? -1 : local[p]!);
      this.nodeTokens.push(t.nodeTokens[k]!);
      for (let i = t.nodeOffset[k]!; i < t.nodeOffset[k + 1]!; i++) {
        this.tokens.push(t.tokens[i]!);
        this.tree.push(ti);
        this.index.push(i);
        this.owned.push(ownedNodes[k]!);
      }
    }
  }

  build(trees: readonly TrainTree[]): TreeMicroBatchPlan {
    const N = this.tokens.length;
    const b: TrainTreeBatch = {
      tokens: Int32Array.from(this.tokens), parent: Int32Array.from(this.parent), nodeTokens: Int32Array.from(this.nodeTokens),
      oldLogprobs: new Float32Array(N), advPos: new Float64Array(N), advNeg: new Float64Array(N), weight: new Float64Array(N),
      countPos: new Float64Array(N), countNeg: new Float64Array(N), count: new Float64Array(N), sequences: this.sequences,
    };
    const plan: TreeMicroBatchPlan = { batch: b, tree: Int32Array.from(this.tree), index: Int32Array.from(this.index), owned: Uint8Array.from(this.owned) };
    for (let j = 0; j < N; j++) {
      const t = trees[plan.tree[j]!]!;
      const i = plan.index[j]!;
      (b.oldLogprobs as Float32Array)[j] = t.oldLogprobs[i]!;
      if (!plan.owned[j]) continue; // context here: another micro-batch carries its loss terms
      (b.advPos as Float64Array)[j] = t.advPos[i]!;
      (b.advNeg as Float64Array)[j] = t.advNeg[i]!;
      (b.weight as Float64Array)[j] = t.weight[i]!;
      (b.countPos as Float64Array)[j] = t.countPos[i]!;
      (b.countNeg as Float64Array)[j] = t.countNeg[i]!;
      (b.count as Float64Array)[j] = t.count[i]!;
    }
    return plan;
  }
}

/**
 * Micro-batches of at most `maxTokens` computed tokens: whole trees packed
 * side by side while they fit; a tree larger than the budget is split by its
 * trajectories in preorder into subtrees, each re-including the ancestors of
 * its first node as context (computed again, with gradient, so the loss of
 * the subtree reaches them) while every token's loss terms stay with the
 * first micro-batch that holds it. A single trajectory longer than the
 * budget goes alone.
 */
export function treeMicroBatches(trees: readonly TrainTree[], maxTokens: number): TreeMicroBatchPlan[] {
  const out: TreeMicroBatchPlan[] = [];
  let cur = new ForestBuilder();
  const flush = (): void => {
    if (cur.size > 0) out.push(cur.build(trees));
    cur = new ForestBuilder();
  };
  trees.forEach((t, ti) => {
    const K = t.parent.length;
    const all = new Uint8Array(K).fill(1);
    const N = t.tokens.length;
    if (N <= maxTokens) {
      if (cur.size + N > maxTokens) flush();
      cur.add(t, ti, all, all);
      cur.sequences += t.leafNode.length;
      return;
    }
    // Split by trajectories, their leaves in preorder (node ids are preorder).
    flush();
    const leaves = Array.from(t.leafNode.keys()).sort((a, b) => t.leafNode[a]! - t.leafNode[b]! || a - b);
    const ownedGlobal = new Uint8Array(K);
    let keep = new Uint8Array(K);
    let ownedHere = new Uint8Array(K);
    let tokens = 0;
    let sequences = 0;
    const emit = (): void => {
      if (tokens === 0) return;
      cur.add(t, ti, keep, ownedHere);
      cur.sequences = sequences;
      flush();
      keep = new Uint8Array(K);
      ownedHere = new Uint8Array(K);
      tokens = 0;
      sequences = 0;
    };
    for (const l of leaves) {
      const path: number[] = [];
      for (let n = t.leafNode[l]!; n >= 0; n = t.parent[n]!) path.push(n);
      let cost = 0;
      for (const n of path) if (!keep[n]) cost += t.nodeTokens[n]!;
      if (tokens > 0 && tokens + cost > maxTokens) {
        emit();
        cost = path.reduce((a, n) => a + t.nodeTokens[n]!, 0);
      }
      for (const n of path) {
        if (keep[n]) continue;
        keep[n] = 1;
        if (!ownedGlobal[n]) (ownedGlobal[n] = 1), (ownedHere[n] = 1);
      }
      tokens += cost;
      sequences++;
    }
    emit();
  });
  flush();
  return out;
}

/**
 * Recomputes the old log-probs of every loss-carrying token with the current
 * policy (`train.oldLogprobs = recompute`), one packed forward per
 * micro-batch, each token read from the micro-batch that owns it.
 */
export async function recomputeTreeLogprobs(model: PolicyModel, trees: readonly TrainTree[], maxTokens: number, temperature: number): Promise<void> {
  for (const plan of treeMicroBatches(trees, maxTokens)) {
    const N = plan.batch.tokens.length;
    const wanted = new Uint8Array(N);
    let any = false;
    for (let j = 0; j < N; j++) {
      if (plan.owned[j] && isLive(trees[plan.tree[j]!]!, plan.index[j]!)) (wanted[j] = 1), (any = true);
    }
    if (!any) continue;
    const r = await model.treeLogprobs(plan.batch, { temperature, wanted });
    for (let j = 0; j < N; j++) if (wanted[j]) trees[plan.tree[j]!]!.oldLogprobs[plan.index[j]!] = r.logprobs[j]!;
  }
}

/** Unique tokens of the trees (what tree packing computes) and tokens of their flattened trajectories. */
export function treeTokenCounts(trees: readonly TrainTree[]): { unique: number; flattened: number } {
  let unique = 0;
  let flattened = 0;
  for (const t of trees) {
    unique += t.tokens.length;
    flattened += t.flatTokens;
  }
  return { unique, flattened };
}
