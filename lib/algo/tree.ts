// ARPO advantage attribution over rollout trees (ARPO.md section 2), on plain
// packed arrays: per node, the sum (soft) or mean (hard) of the advantages of
// the leaves beneath it, expanded to that node's tokens by the native kernels
// (arpo::kernels::tree_reduce / tree_expand).
import { invalidArgument, unknownName } from '../errors';
import { treeExpand, treeReduce } from '../native/kernels';
import { computeAdvantages, type EstimatorOptions, type GroupKey } from './advantages';

/**
 * Rollout trees as plain arrays (the form lib/rollout's packTrees produces).
 * Nodes are in topological order (parent[n] < n, roots -1); node n owns
 * tokens [tokenOffset[n], tokenOffset[n] + tokenCount[n]) of the packed
 * token buffer; leaf l (one trajectory) ends at node leafNode[l].
 */
export interface PackedTreeArrays {
  readonly parent: Int32Array;
  readonly tokenOffset: ArrayLike<number>;
  readonly tokenCount: ArrayLike<number>;
  readonly leafNode: Int32Array;
  /** Tree (prompt) of each leaf; the default groups leaves by their root node. */
  readonly leafTree?: ArrayLike<number>;
  /** (P) 1 for loss tokens, 0 for prompt and tool-result tokens; used for per-leaf token counts. */
  readonly lossMask?: ArrayLike<number>;
  /** P, the packed token count (default: tokens.length, else the end of the last span). */
  readonly tokens?: { readonly length: number };
}

/** The kernels the attribution runs on (the native ones by default). */
export interface TreeKernels {
  treeReduce(parent: Int32Array, leafNode: Int32Array, leafAdvantage: Float32Array): { nodeSum: Float32Array; nodeMean: Float32Array; nodeCount: Int32Array };
  treeExpand(tokenValue: Float32Array, nodeValue: Float32Array, tokenOffset: ArrayLike<number>, tokenCount: ArrayLike<number>): void;
}

/** Soft: a node's tokens get the sum of its leaves' advantages; hard: their mean, counted once. */
export const ATTRIBUTIONS = ['soft', 'hard'] as const;
export type Attribution = (typeof ATTRIBUTIONS)[number];

export interface TreeAttributionResult {
  /** (P) per-token advantage (gradient weight) in the packed buffer; tokens of no node stay 0. */
  readonly tokenAdvantages: Float32Array;
  /** (N) the value each node's tokens got. */
  readonly nodeValues: Float32Array;
  /** (N) leaves under each node (d in ARPO.md: how many trajectories share it). */
  readonly nodeLeafCounts: Int32Array;
}

/** The native tree kernels (lib/native/kernels.ts); the addon loads on first call. */
const NATIVE_TREE_KERNELS: TreeKernels = { treeReduce, treeExpand };

export function nativeTreeKernels(): TreeKernels {
  return NATIVE_TREE_KERNELS;
}

/** Number of packed tokens P. */
function tokenTotal(trees: PackedTreeArrays): number {
  if (trees.tokens) return trees.tokens.length;
  if (trees.lossMask) return trees.lossMask.length;
  let end = 0;
  for (let n = 0; n < trees.parent.length; n++) end = Math.max(end, (trees.tokenOffset[n] as number) + (trees.tokenCount[n] as number));
  return end;
}

/** Checks shapes and structure once, in TS, so the kernel sees only valid input. */
export function validatePackedTrees(trees: PackedTreeArrays): void {
  if (trees === null || typeof trees !== 'object') throw invalidArgument('packed tree arrays { parent, tokenOffset, tokenCount, leafNode }', 'trees', trees);
  const { parent, tokenOffset, tokenCount, leafNode } = trees;
  if (!(parent instanceof Int32Array)) throw invalidArgument('an Int32Array', 'parent', parent);
  if (!(leafNode instanceof Int32Array)) throw invalidArgument('an Int32Array', 'leafNode', leafNode);
  const N = parent.length;
  if (tokenOffset?.length !== N) throw invalidArgument(`an array of ${N} token offsets`, 'tokenOffset', tokenOffset);
  if (tokenCount?.length !== N) throw invalidArgument(`an array of ${N} token counts`, 'tokenCount', tokenCount);
  const P = tokenTotal(trees);
  for (let n = 0; n < N; n++) {
    const p = parent[n] as number;
    if (p < -1 || p >= n) throw invalidArgument(`-1 or a node index below ${n}`, `parent[${n}]`, p);
    const off = tokenOffset[n] as number;
    const cnt = tokenCount[n] as number;
    if (!Number.isInteger(off) || !Number.isInteger(cnt) || off < 0 || cnt < 0 || off + cnt > P) {
      throw invalidArgument(`a token span inside [0, ${P})`, `tokenOffset[${n}]/tokenCount[${n}]`, [off, cnt]);
    }
  }
  for (let l = 0; l < leafNode.length; l++) {
    const node = leafNode[l] as number;
    if (node < 0 || node >= N) throw invalidArgument(`a node index in [0, ${N})`, `leafNode[${l}]`, node);
  }
  if (trees.leafTree !== undefined && trees.leafTree.length !== leafNode.length) {
    throw invalidArgument(`an array of ${leafNode.length} tree indices`, 'leafTree', trees.leafTree);
  }
}

/**
 * Attributes leaf advantages to every token of the trees. Soft gives each
 * node Σ of its leaves' Â, which is what GRPO on the flattened trajectories
 * puts on that token (d identical copies, one per trajectory); hard gives
 * (1/d) Σ Â, counted once.
 */
export function attributeTreeAdvantages(
  trees: PackedTreeArrays,
  leafAdvantages: ArrayLike<number>,
  attribution: Attribution = 'soft',
  kernels: TreeKernels = nativeTreeKernels(),
): TreeAttributionResult {
  if (!(ATTRIBUTIONS as readonly string[]).includes(attribution)) throw unknownName('advantage attribution', String(attribution), ATTRIBUTIONS);
  validatePackedTrees(trees);
  if (leafAdvantages?.length !== trees.leafNode.length) throw invalidArgument(`an array of ${trees.leafNode.length} leaf advantages`, 'leafAdvantages', leafAdvantages);
  const adv = new Float32Array(leafAdvantages.length);
  for (let l = 0; l < adv.length; l++) {
    const a = leafAdvantages[l];
    if (typeof a !== 'number' || !Number.isFinite(a)) throw invalidArgument('a finite number', `leafAdvantages[${l}]`, a);
    adv[l] = a;
  }
  const { nodeSum, nodeMean, nodeCount } = kernels.treeReduce(trees.parent, trees.leafNode, adv);
  const nodeValues = attribution === 'soft' ? nodeSum : nodeMean;
  const tokenAdvantages = new Float32Array(tokenTotal(trees));
  kernels.treeExpand(tokenAdvantages, nodeValues, trees.tokenOffset, trees.tokenCount);
  return { tokenAdvantages, nodeValues, nodeLeafCounts: nodeCount };
}

/** Group of each leaf: leafTree when given, else its root node. */
export function leafGroups(trees: PackedTreeArrays): GroupKey[] {
  if (trees.leafTree) return Array.from(trees.leafTree);
  return Array.from(trees.leafNode, (node) => {
    let n = node;
    while ((trees.parent[n] as number) >= 0) n = trees.parent[n] as number;
    return n;
  });
}

/** Loss tokens on each leaf's root-to-leaf path (its response length, for token-weighted estimators). */
export function leafResponseLengths(trees: PackedTreeArrays): number[] {
  const mask = trees.lossMask;
  const nodeTokens = Array.from({ length: trees.parent.length }, (_, n) => {
    const off = trees.tokenOffset[n] as number;
    const cnt = trees.tokenCount[n] as number;
    if (!mask) return cnt;
    let k = 0;
    for (let i = off; i < off + cnt; i++) if ((mask[i] as number) !== 0) k++;
    return k;
  });
  return Array.from(trees.leafNode, (node) => {
    let total = 0;
    for (let n = node; n >= 0; n = trees.parent[n] as number) total += nodeTokens[n] as number;
    return total;
  });
}

export interface TreeAdvantageOptions extends EstimatorOptions {
  /** Advantage estimator name (default `grpo`). */
  readonly estimator?: string;
  /** `soft` (default) or `hard`. */
  readonly attribution?: Attribution;
  /** The leaves' advantages computed elsewhere (over a larger batch: data parallel); the estimator is then not run. */
  readonly leafAdvantages?: Float64Array;
  readonly kernels?: TreeKernels;
}

/** Leaf rewards -> group advantages (per tree) -> per-token attribution. */
export function treeAdvantages(
  trees: PackedTreeArrays,
  leafRewards: ArrayLike<number>,
  options: TreeAdvantageOptions = {},
): TreeAttributionResult & { readonly leafAdvantages: Float64Array } {
  validatePackedTrees(trees);
  if (options.leafAdvantages && options.leafAdvantages.length !== trees.leafNode.length) {
    throw invalidArgument(`a Float64Array of ${trees.leafNode.length} leaf advantages`, 'options.leafAdvantages', options.leafAdvantages);
  }
  const leafAdvantages =
    options.leafAdvantages ??
    computeAdvantages(options.estimator ?? 'grpo', { rewards: leafRewards, groups: leafGroups(trees), responseLengths: leafResponseLengths(trees) }, options);
  const result = attributeTreeAdvantages(trees, leafAdvantages, options.attribution ?? 'soft', options.kernels ?? nativeTreeKernels());
  return { ...result, leafAdvantages };
}
