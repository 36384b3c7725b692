// RolloutTree: one prompt's rollout as a tree of token segments (prompt,
// generated segments, tool results); leaves are complete trajectories. Views:
// flattened trajectories, the packed tree for tree-aware training, a JSON dump.
import { ArpoError, invalidArgument } from '../errors';
import type { FinishReason, PathOrigin, TokenText } from './types';

export type NodeKind = 'prompt' | 'generated' | 'tool_result';
const KIND_CODE: Record<NodeKind, number> = { prompt: 0, generated: 1, tool_result: 2 };

/** The tool call a result node answers. */
export interface ToolCallInfo {
  readonly tag: string;
  readonly content: string;
  readonly ok: boolean;
  readonly cached: boolean;
  /** Wall time of the call (timing; left out of the JSON dump unless asked for). */
  readonly ms: number;
}

/** A node: a run of tokens that every trajectory below it shares. */
export interface RolloutNode {
  readonly id: number;
  readonly kind: NodeKind;
  /** Parent node id, -1 for the prompt; always smaller than id (topological order). */
  readonly parent: number;
  /** 0 for the prompt, parent's depth + 1 otherwise. */
  readonly depth: number;
  /** Position of the first token in the trajectory (prompt tokens included); span = [start, start + tokens.length). */
  readonly start: number;
  readonly tokens: readonly number[];
  /** Per generated token: log-probability under the sampling distribution, entropy (nats), entropy / ln V. Empty for other kinds. */
  readonly logprobs: readonly number[];
  readonly entropies: readonly number[];
  readonly normEntropies: readonly number[];
  readonly children: readonly number[];
  /** Creation order (within the prompt) of the path that wrote it; -1 for the prompt. */
  readonly path: number;
  /** Set on the first generated node of a path: how the path came to exist. */
  readonly origin?: PathOrigin;
  readonly tool?: ToolCallInfo;
  /** Index of the leaf (trajectory) ending here, or -1. */
  readonly leaf: number;
}

/** A complete trajectory: the path from the prompt to `node`. */
export interface RolloutLeaf {
  readonly index: number;
  readonly node: number;
  readonly finishReason: FinishReason;
  readonly path: number;
  readonly origin: PathOrigin;
  /** Sampling stream of its path (its own tokens; the shared prefix was sampled by its ancestors). */
  readonly stream: bigint;
  readonly toolCalls: number;
}

/** Flattened view of one leaf: fresh arrays, shared with nothing. */
export interface Trajectory {
  readonly prompt: number;
  readonly leaf: number;
  readonly path: number;
  readonly origin: PathOrigin;
  readonly finishReason: FinishReason;
  /** Prompt then response tokens. */
  readonly tokens: Int32Array;
  readonly promptLength: number;
  /** 1 where the policy sampled the token (trained); 0 for the prompt and tool results (context, not actions). */
  readonly lossMask: Uint8Array;
  /** Sampling log-probabilities and entropies; 0 where the mask is 0. */
  readonly logprobs: Float32Array;
  readonly entropies: Float32Array;
  readonly normEntropies: Float32Array;
  /** Node ids from the prompt to the leaf. */
  readonly nodes: Int32Array;
  readonly toolTags: readonly string[];
}

/**
 * Several trees packed as plain arrays (what lib/algo's tree attribution and
 * `arpo::kernels::tree_reduce` / `tree_expand` take). Nodes are in topological
 * order (parent[n] < n, roots -1); node n's tokens are
 * tokens[tokenOffset[n] .. tokenOffset[n] + tokenCount[n]).
 */
export interface PackedTrees {
  readonly tokens: Int32Array;
  /** Position of each token in its trajectories (the same in all of them). */
  readonly positions: Int32Array;
  readonly lossMask: Uint8Array;
  readonly logprobs: Float32Array;
  readonly parent: Int32Array;
  readonly tokenOffset: Int32Array;
  readonly tokenCount: Int32Array;
  /** 0 prompt, 1 generated, 2 tool result. */
  readonly nodeKind: Uint8Array;
  readonly nodeTree: Int32Array;
  /** Leaves, tree after tree: the node each ends at and its tree. */
  readonly leafNode: Int32Array;
  readonly leafTree: Int32Array;
  /** treeNodeOffset[t] .. treeNodeOffset[t + 1]: tree t's nodes (same for leaves). */
  readonly treeNodeOffset: Int32Array;
  readonly treeLeafOffset: Int32Array;
}

interface MutableNode {
  id: number;
  kind: NodeKind;
  parent: number;
  depth: number;
  start: number;
  tokens: number[];
  logprobs: number[];
  entropies: number[];
  normEntropies: number[];
  children: number[];
  path: number;
  origin?: PathOrigin;
  tool?: ToolCallInfo;
  leaf: number;
}

function checkTokens(name: string, tokens: ArrayLike<number>, vocabSize: number): void {
  for (let i = 0; i < tokens.length; i++) {
    const t = tokens[i] as number;
    if (!Number.isInteger(t) || t < 0 || t >= vocabSize) throw invalidArgument(`token ids in [0, ${vocabSize})`, `${name}[${i}]`, t);
  }
}

export class RolloutTree {
  private readonly nodeList: MutableNode[] = [];
  private readonly leafList: RolloutLeaf[] = [];

  /** `prompt`: index of the prompt in its batch. */
  constructor(
    readonly prompt: number,
    promptTokens: ArrayLike<number>,
    readonly vocabSize: number,
  ) {
    if (!Number.isInteger(vocabSize) || vocabSize < 1) throw invalidArgument('a positive integer', 'vocabSize', vocabSize);
    if (promptTokens === null || typeof promptTokens !== 'object' || typeof promptTokens.length !== 'number' || promptTokens.length < 1) {
      throw invalidArgument('a non-empty array of token ids', 'promptTokens', promptTokens);
    }
    checkTokens('promptTokens', promptTokens, vocabSize);
    this.push({ kind: 'prompt', parent: -1, tokens: Array.from(promptTokens), path: -1 });
  }

  get nodeCount(): number {
    return this.nodeList.length;
  }
  get leafCount(): number {
    return this.leafList.length;
  }
  get promptLength(): number {
    return this.mut(0).tokens.length;
  }
  node(id: number): RolloutNode {
    return this.mut(id);
  }
  get nodes(): readonly RolloutNode[] {
    return this.nodeList;
  }
  get leaves(): readonly RolloutLeaf[] {
    return this.leafList;
  }

  private mut(id: number): MutableNode {
    const n = Number.isInteger(id) ? this.nodeList[id] : undefined;
    if (!n) throw invalidArgument(`a node id in [0, ${this.nodeList.length})`, 'node', id);
    return n;
  }

  private push(spec: { kind: NodeKind; parent: number; tokens: number[]; path: number; origin?: PathOrigin; tool?: ToolCallInfo }): number {
    const id = this.nodeList.length;
    const p = spec.parent >= 0 ? this.mut(spec.parent) : undefined;
    const node: MutableNode = {
      id,
      kind: spec.kind,
      parent: spec.parent,
      depth: p ? p.depth + 1 : 0,
      start: p ? p.start + p.tokens.length : 0,
      tokens: spec.tokens,
      logprobs: [],
      entropies: [],
      normEntropies: [],
      children: [],
      path: spec.path,
      leaf: -1,
    };
    if (spec.origin) node.origin = spec.origin;
    if (spec.tool) node.tool = spec.tool;
    this.nodeList.push(node);
    p?.children.push(id);
    return id;
  }

  /**
   * A new, empty generated segment under the prompt or a tool result (a
   * segment ends at a tool call or at the end of the trajectory, so it never
   * hangs below another generated segment).
   */
  addGenerated(parent: number, path: number, origin?: PathOrigin): number {
    const p = this.mut(parent);
    if (p.kind === 'generated') throw invalidArgument('a prompt or tool-result node', 'parent', parent);
    if (p.leaf >= 0) throw new ArpoError('INVALID_ARGUMENT', `Node ${parent} ends a trajectory; nothing can follow it`);
    return this.push({ kind: 'generated', parent, tokens: [], path, ...(origin ? { origin } : {}) });
  }

  /** Appends one sampled token with its log-probability and entropy (nats, and / ln V). */
  appendGenerated(node: number, token: number, logprob: number, entropy: number, normEntropy: number): void {
    const n = this.mut(node);
    if (n.kind !== 'generated') throw invalidArgument('a generated node', 'node', node);
    if (n.children.length > 0 || n.leaf >= 0) throw new ArpoError('INVALID_ARGUMENT', `Generated node ${node} is closed`);
    if (!Number.isInteger(token) || token < 0 || token >= this.vocabSize) throw invalidArgument(`a token id in [0, ${this.vocabSize})`, 'token', token);
    n.tokens.push(token);
    n.logprobs.push(logprob);
    n.entropies.push(entropy);
    n.normEntropies.push(normEntropy);
  }

  /** The tool result after a generated segment that ended in a call: context tokens, masked out of the loss. */
  addToolResult(parent: number, tokens: ArrayLike<number>, tool: ToolCallInfo, path: number): number {
    const p = this.mut(parent);
    if (p.kind !== 'generated' || p.tokens.length === 0) throw invalidArgument('a non-empty generated node', 'parent', parent);
    if (p.leaf >= 0) throw new ArpoError('INVALID_ARGUMENT', `Node ${parent} ends a trajectory; nothing can follow it`);
    if (tokens.length < 1) throw invalidArgument('a non-empty token array', 'tool result tokens', tokens);
    checkTokens('tool result tokens', tokens, this.vocabSize);
    return this.push({ kind: 'tool_result', parent, tokens: Array.from(tokens), path, tool });
  }

  /** Marks `node` as the end of a complete trajectory. */
  addLeaf(node: number, finishReason: FinishReason, meta: { path: number; origin: PathOrigin; stream: bigint; toolCalls: number }): number {
    const n = this.mut(node);
    if (n.kind === 'prompt') throw invalidArgument('a generated or tool-result node', 'node', node);
    if (n.leaf >= 0) throw new ArpoError('INVALID_ARGUMENT', `Node ${node} already ends trajectory ${n.leaf}`);
    const index = this.leafList.length;
    n.leaf = index;
    this.leafList.push({ index, node, finishReason, path: meta.path, origin: meta.origin, stream: meta.stream, toolCalls: meta.toolCalls });
    return index;
  }

  /**
   * Renumbers nodes in depth-first preorder with children by path order, and
   * leaves by path order, so the numbering no longer depends on the order in
   * which a concurrent rollout happened to create them (parents stay before
   * children).
   */
  canonicalize(): void {
    const byPath = (a: number, b: number): number => this.mut(a).path - this.mut(b).path;
    const preorder: number[] = [];
    const stack = [0];
    while (stack.length > 0) {
      const id = stack.pop() as number;
      preorder.push(id);
      const kids = [...this.mut(id).children].sort(byPath);
      for (let i = kids.length - 1; i >= 0; i--) stack.push(kids[i] as number);
    }
    if (preorder.length !== this.nodeList.length) throw new ArpoError('INVALID_ARGUMENT', 'RolloutTree.canonicalize: nodes unreachable from the prompt');
    const newId = new Int32Array(this.nodeList.length);
    preorder.forEach((old, i) => (newId[old] = i));
    const old = [...this.nodeList];
    const leaves = [...this.leafList].sort((a, b) => a.path - b.path);
    this.nodeList.length = 0;
    for (const id of preorder) {
      const n = old[id] as MutableNode;
      n.id = newId[id] as number;
      n.parent = n.parent < 0 ? -1 : (newId[n.parent] as number);
      n.children = [...n.children].sort((a, b) => (old[a] as MutableNode).path - (old[b] as MutableNode).path).map((c) => newId[c] as number);
      this.nodeList.push(n);
    }
    this.leafList.length = 0;
    leaves.forEach((l, index) => {
      const node = newId[l.node] as number;
      (this.nodeList[node] as MutableNode).leaf = index;
      this.leafList.push({ ...l, index, node });
    });
  }

  /** Node ids from the prompt down to `node`. */
  pathTo(node: number): number[] {
    const out: number[] = [];
    for (let id = node; id >= 0; id = this.mut(id).parent) out.push(id);
    return out.reverse();
  }

  /** Leaves (indices) in the subtree of `node`, in leaf order. */
  leavesBelow(node: number): number[] {
    this.mut(node);
    const out: number[] = [];
    for (const leaf of this.leafList) {
      for (let id = leaf.node; id >= 0; id = this.mut(id).parent) {
        if (id === node) {
          out.push(leaf.index);
          break;
        }
        if (id < node) break; // ancestors have smaller ids
      }
    }
    return out;
  }

  /** Response tokens (prompt excluded) of every leaf, summed: each shared token counted once per leaf. */
  totalResponseTokens(): number {
    let sum = 0;
    for (const leaf of this.leafList) {
      const n = this.mut(leaf.node);
      sum += n.start + n.tokens.length - this.promptLength;
    }
    return sum;
  }

  /** Response tokens in the tree, each node once. */
  uniqueResponseTokens(): number {
    let sum = 0;
    for (const n of this.nodeList) if (n.kind !== 'prompt') sum += n.tokens.length;
    return sum;
  }

  /** One trajectory per leaf, in leaf order, each with freshly allocated arrays. */
  trajectories(): Trajectory[] {
    return this.leafList.map((leaf) => this.trajectory(leaf.index));
  }

  trajectory(leafIndex: number): Trajectory {
    const leaf = this.leafList[leafIndex];
    if (!leaf) throw invalidArgument(`a leaf index in [0, ${this.leafList.length})`, 'leaf', leafIndex);
    const ids = this.pathTo(leaf.node);
    const end = this.mut(leaf.node);
    const length = end.start + end.tokens.length;
    const tokens = new Int32Array(length);
    const lossMask = new Uint8Array(length);
    const logprobs = new Float32Array(length);
    const entropies = new Float32Array(length);
    const normEntropies = new Float32Array(length);
    const toolTags: string[] = [];
    for (const id of ids) {
      const n = this.mut(id);
      tokens.set(n.tokens, n.start);
      if (n.kind === 'generated') {
        lossMask.fill(1, n.start, n.start + n.tokens.length); // sampled by the policy: trained
        logprobs.set(n.logprobs, n.start);
        entropies.set(n.entropies, n.start);
        normEntropies.set(n.normEntropies, n.start);
      } else if (n.kind === 'tool_result' && n.tool) {
        toolTags.push(n.tool.tag); // tool output: mask stays 0 (context, not an action)
      }
    }
    return {
      prompt: this.prompt,
      leaf: leaf.index,
      path: leaf.path,
      origin: leaf.origin,
      finishReason: leaf.finishReason,
      tokens,
      promptLength: this.promptLength,
      lossMask,
      logprobs,
      entropies,
      normEntropies,
      nodes: Int32Array.from(ids),
      toolTags,
    };
  }

  /** This tree alone, packed. */
  packed(): PackedTrees {
    return packTrees([this]);
  }

  /** A JSON-ready dump for inspection and the report (text per node when a detokeniser is given). */
  toJSON(options: { text?: TokenText; timing?: boolean } = {}): RolloutTreeJSON {
    return {
      prompt: this.prompt,
      promptLength: this.promptLength,
      nodes: this.nodeList.map((n) => {
        const out: RolloutNodeJSON = {
          id: n.id,
          kind: n.kind,
          parent: n.parent,
          depth: n.depth,
          start: n.start,
          length: n.tokens.length,
          path: n.path,
          tokens: [...n.tokens],
          leavesBelow: this.leavesBelow(n.id).length,
        };
        if (options.text) out.text = options.text.decode(n.tokens);
        if (n.origin) out.origin = n.origin;
        if (n.kind === 'generated') {
          out.logprobs = [...n.logprobs];
          out.meanNormEntropy = n.normEntropies.length ? n.normEntropies.reduce((a, b) => a + b, 0) / n.normEntropies.length : 0;
        }
        if (n.tool) {
          out.tool = { tag: n.tool.tag, content: n.tool.content, ok: n.tool.ok, cached: n.tool.cached };
          if (options.timing) out.tool.ms = n.tool.ms;
        }
        if (n.leaf >= 0) out.leaf = n.leaf;
        return out;
      }),
      leaves: this.leafList.map((l) => ({ ...l, stream: l.stream.toString() })),
    };
  }
}

export interface RolloutNodeJSON {
  id: number;
  kind: NodeKind;
  parent: number;
  depth: number;
  start: number;
  length: number;
  path: number;
  tokens: number[];
  leavesBelow: number;
  text?: string;
  origin?: PathOrigin;
  logprobs?: number[];
  meanNormEntropy?: number;
  tool?: { tag: string; content: string; ok: boolean; cached: boolean; ms?: number };
  leaf?: number;
}

export interface RolloutTreeJSON {
  prompt: number;
  promptLength: number;
  nodes: RolloutNodeJSON[];
  leaves: (Omit<RolloutLeaf, 'stream'> & { stream: string })[];
}

/** Packs several trees into one set of plain arrays (node ids offset per tree, parents stay smaller than children). */
export function packTrees(trees: readonly RolloutTree[]): PackedTrees {
  let nodes = 0;
  let leaves = 0;
  let tokens = 0;
  for (const t of trees) {
    nodes += t.nodeCount;
    leaves += t.leafCount;
    for (const n of t.nodes) tokens += n.tokens.length;
  }
  const out = {
    tokens: new Int32Array(tokens),
    positions: new Int32Array(tokens),
    lossMask: new Uint8Array(tokens),
    logprobs: new Float32Array(tokens),
    parent: new Int32Array(nodes),
    tokenOffset: new Int32Array(nodes),
    tokenCount: new Int32Array(nodes),
    nodeKind: new Uint8Array(nodes),
    nodeTree: new Int32Array(nodes),
    leafNode: new Int32Array(leaves),
    leafTree: new Int32Array(leaves),
    treeNodeOffset: new Int32Array(trees.length + 1),
    treeLeafOffset: new Int32Array(trees.length + 1),
  };
  let nodeBase = 0;
  let leafBase = 0;
  let offset = 0;
  trees.forEach((t, ti) => {
    out.treeNodeOffset[ti] = nodeBase;
    out.treeLeafOffset[ti] = leafBase;
    for (const n of t.nodes) {
      const g = nodeBase + n.id;
      out.parent[g] = n.parent < 0 ? -1 : nodeBase + n.parent;
      out.tokenOffset[g] = offset;
      out.tokenCount[g] = n.tokens.length;
      out.nodeKind[g] = KIND_CODE[n.kind];
      out.nodeTree[g] = ti;
      out.tokens.set(n.tokens, offset);
      for (let i = 0; i < n.tokens.length; i++) out.positions[offset + i] = n.start + i;
      if (n.kind === 'generated') {
        out.lossMask.fill(1, offset, offset + n.tokens.length);
        out.logprobs.set(n.logprobs, offset);
      }
      offset += n.tokens.length;
    }
    for (const l of t.leaves) {
      out.leafNode[leafBase + l.index] = nodeBase + l.node;
      out.leafTree[leafBase + l.index] = ti;
    }
    nodeBase += t.nodeCount;
    leafBase += t.leafCount;
  });
  out.treeNodeOffset[trees.length] = nodeBase;
  out.treeLeafOffset[trees.length] = leafBase;
  return out;
}
