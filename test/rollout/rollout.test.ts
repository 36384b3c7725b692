// The rollout engine end to end on the deterministic fake agent: budget
// accounting, branch placement, KV sharing and unforked replay, determinism
// under random tool latency and batch width, the fixes over the reference
// (per-trajectory baseline, current-call entropy, refill, tool limit), the
// trajectory-level baseline, continuous batching, and failures.
import { rollout, type RolloutDeps, type RolloutResult } from '../../lib/rollout/scheduler';
import type { RolloutSettings } from '../../lib/rollout/settings';
import type { RolloutTree, Trajectory } from '../../lib/rollout/tree';
import type { BranchDecision } from '../../lib/rollout/types';
import { EOS, FakeEngine, fakeDistributionsAlong, fakePrompt, fakeText, fakeTools, lcg, VOCAB_SIZE, type FakeModelOptions } from './fake-engine';

interface Run {
  result: RolloutResult;
  engine: FakeEngine;
  tools: ReturnType<typeof fakeTools>;
}

async function run(
  settings: Partial<RolloutSettings>,
  opts: { prompts?: number[][]; seed?: number; latency?: () => number; model?: Partial<FakeModelOptions>; engineDelay?: () => number } = {},
): Promise<Run> {
  const engine = new FakeEngine(opts.model ?? {}, opts.engineDelay);
  const tools = fakeTools(opts.latency ?? (() => 0));
  const deps: RolloutDeps = { engine, text: fakeText, executeTool: tools.execute, eosTokenIds: [EOS] };
  const prompts = opts.prompts ?? [0, 1, 2].map(fakePrompt);
  const result = await rollout(deps, prompts, opts.seed ?? 7, { maxResponseTokens: 400, ...settings });
  return { result, engine, tools };
}

/** Generated segments of a trajectory as [start, end) position ranges, in order. */
function segments(t: Trajectory): [number, number][] {
  const out: [number, number][] = [];
  for (let i = t.promptLength; i < t.tokens.length; i++) {
    if (t.lossMask[i] !== 1) continue;
    const last = out[out.length - 1];
    if (last && last[1] === i) last[1] = i + 1;
    else out.push([i, i + 1]);
  }
  return out;
}

const mean = (xs: ArrayLike<number>, a: number, b: number): number => {
  let s = 0;
  for (let i = a; i < b; i++) s += xs[i] as number;
  return b > a ? s / (b - a) : 0;
};

function leafOfPath(tree: RolloutTree, path: number): Trajectory {
  const leaf = tree.leaves.find((l) => l.path === path);
  if (!leaf) throw new Error(`no leaf for path ${path}`);
  return tree.trajectory(leaf.index);
}

describe('ARPO rollout on the fake agent', () => {
  test('budget: exactly M leaves per prompt over 24 random configurations; every engine path freed', async () => {
    const rand = lcg(2024);
    for (let c = 0; c < 24; c++) {
      const budget = 1 + Math.floor(rand() * 10);
      const initialSamples = 1 + Math.floor(rand() * budget);
      const settings: Partial<RolloutSettings> = {
        budget,
        initialSamples,
        branchesPerDecision: 1 + Math.floor(rand() * 3),
        branchProbability: rand(),
        entropyWeight: rand() * 2 - 1,
        branchRule: rand() < 0.5 ? 'bernoulli' : 'threshold',
        branchThreshold: rand(),
        toolCallLimit: Math.floor(rand() * 4),
        entropyWindow: 1 + Math.floor(rand() * 20),
        maxResponseTokens: 40 + Math.floor(rand() * 200),
      };
      const { result, engine } = await run(settings, { seed: c, prompts: [fakePrompt(c), fakePrompt(c + 100)] });
      for (const tree of result.trees) {
        expect(tree.leafCount).toBe(budget);
        expect(new Set(tree.leaves.map((l) => l.node)).size).toBe(budget);
        expect(new Set(tree.leaves.map((l) => l.path))).toEqual(new Set(Array.from({ length: budget }, (_, i) => i)));
        for (const t of tree.trajectories()) expect(t.tokens.length - t.promptLength).toBeLessThanOrEqual(settings.maxResponseTokens as number);
      }
      const m = result.metrics;
      expect(m.paths.global + m.paths.branch + m.paths.refill).toBe(2 * budget);
      expect(m.paths.global).toBe(2 * initialSamples);
      expect(m.branches).toBe(m.paths.branch);
      expect(engine.livePaths).toBe(0);
    }
  });

  test('branches hang from the end of the deciding path\'s tool result and re-sample the first token after it', async () => {
    const { result } = await run({ budget: 12, initialSamples: 4, branchProbability: 0.8, branchesPerDecision: 2 }, { prompts: [0, 1, 2, 3].map(fakePrompt) });
    let checked = 0;
    for (const d of result.decisions.filter((x) => x.branches > 0)) {
      const tree = result.trees[d.prompt] as RolloutTree;
      const parentTraj = leafOfPath(tree, d.path);
      for (const b of d.branchPaths) {
        const first = tree.nodes.find((n) => n.path === b && n.kind === 'generated' && n.origin === 'branch');
        if (!first) throw new Error('branch without a first node');
        const result = tree.node(first.parent);
        expect(result.kind).toBe('tool_result');
        expect(result.path).toBe(d.path);
        expect(result.depth).toBe(d.depth);
        expect(first.start).toBe(result.start + result.tokens.length);
        // the result is the d.toolCall-th on the deciding path's own trajectory
        const resultsOnPath = Array.from(parentTraj.nodes).filter((id) => tree.node(id).kind === 'tool_result');
        expect(resultsOnPath[d.toolCall - 1]).toBe(result.id);
        // the branch's prefix is token for token the deciding trajectory's prefix
        const branchTraj = leafOfPath(tree, b);
        expect(Array.from(branchTraj.tokens.subarray(0, first.start))).toEqual(Array.from(parentTraj.tokens.subarray(0, first.start)));
        checked++;
      }
    }
    expect(checked).toBeGreaterThan(5);
  });

  test.each([false, true])('forks share the KV cache: tokens computed follow the tree formula, far below recomputing every leaf (speculative refills: %s)', async (speculativeRefills) => {
    const { result, engine } = await run({ budget: 10, initialSamples: 3, branchProbability: 0.7, speculativeRefills }, { prompts: [0, 1, 2, 3].map(fakePrompt) });
    let expected = 0;
    let replayEverything = 0;
    for (const tree of result.trees) {
      const unique = tree.nodes.reduce((a, n) => a + n.tokens.length, 0);
      const fresh = tree.leaves.filter((l) => l.origin !== 'branch').length;
      const branches = tree.leaves.length - fresh;
      const unfedLast = tree.leaves.filter((l) => tree.node(l.node).kind === 'generated').length;
      // each token once; + the prompt's last token once per fresh path (- the one in `unique`);
      // + the result's last token re-fed per branch; - the last sampled token of a finished leaf (never fed)
      expected += unique - 1 + fresh + branches - unfedLast;
      for (const t of tree.trajectories()) replayEverything += t.tokens.length;
    }
    // Dropped speculative refills: one token fed per sample they drew (the prompt's last, then each sample but the last).
    const dropped = result.metrics.speculation.tokensDropped;
    if (speculativeRefills) expect(result.metrics.speculation.started).toBe(4 * 7);
    else expect(result.metrics.speculation).toEqual({ started: 0, kept: 0, tokensDropped: 0 });
    expected += dropped;
    expect(engine.computedTokens).toBe(expected);
    expect(result.metrics.tokensComputed).toBe(expected);
    expect(result.metrics.paths.branch).toBeGreaterThan(5);
    expect(engine.computedTokens).toBeLessThan(0.7 * replayEverything);
  });

  test('every leaf matches an unforked replay token for token (same stream, fresh cache)', async () => {
    const { result } = await run({ budget: 8, initialSamples: 3, branchProbability: 0.9 }, { prompts: [fakePrompt(5), fakePrompt(6)], seed: 99 });
    const replay = new FakeEngine();
    let own = 0;
    for (const tree of result.trees) {
      for (const leaf of tree.leaves) {
        const t = tree.trajectory(leaf.index);
        const firstOwn = Array.from(t.nodes).map((id) => tree.node(id)).find((n) => n.kind === 'generated' && n.path === leaf.path);
        if (!firstOwn) throw new Error('leaf without own tokens');
        const id = replay.newPath(leaf.stream);
        let pos = firstOwn.start;
        let feed = t.tokens.slice(0, pos);
        while (pos < t.tokens.length) {
          const r = await replay.extend([id], [feed], { temperature: 1, seed: 99 });
          expect(r.tokens[0]).toBe(t.tokens[pos]);
          expect(r.logprobs[0]).toBe(t.logprobs[pos]);
          expect(r.normEntropies[0]).toBe(t.normEntropies[pos]);
          own++;
          let end = pos + 1;
          while (end < t.tokens.length && t.lossMask[end] === 0) end++; // tool result: fed, not sampled
          feed = t.tokens.slice(pos, end);
          pos = end;
        }
        replay.freePath(id);
      }
    }
    expect(own).toBeGreaterThan(200);
  });

  test('deterministic: the same seed gives the same trees whatever the tool latencies and the batch width', async () => {
    const settings = { budget: 8, initialSamples: 4, branchProbability: 0.6 };
    const prompts = [0, 1, 2, 3, 4].map(fakePrompt);
    const a = await run(settings, { prompts, latency: () => 0 });
    const r1 = lcg(1);
    const r2 = lcg(2);
    const b = await run({ ...settings, maxBatchPaths: 3 }, { prompts, latency: () => Math.floor(r1() * 15), engineDelay: () => (r2() < 0.2 ? 2 : 0) });
    const r3 = lcg(3);
    const c = await run({ ...settings, maxBatchTokens: 12 }, { prompts, latency: () => Math.floor(r3() * 8) });
    for (const call of c.engine.calls) if (call.lengths.length > 1) expect(call.lengths.reduce((x, y) => x + y, 0)).toBeLessThanOrEqual(12);
    const d = await run({ ...settings, maxBatchPaths: 1 }, { prompts });
    const key = (r: Run) => JSON.stringify(r.result.trees.map((t) => t.toJSON()));
    const decisions = (r: Run) => [...r.result.decisions].sort((x, y) => x.prompt - y.prompt || x.path - y.path || x.toolCall - y.toolCall);
    expect(key(b)).toBe(key(a));
    expect(key(c)).toBe(key(a));
    expect(key(d)).toBe(key(a));
    expect(decisions(b)).toEqual(decisions(a));
    expect(decisions(c)).toEqual(decisions(a));
    expect(b.engine.maxBatch).toBeLessThanOrEqual(3);
    expect(a.result.metrics.branches).toBeGreaterThan(3);
    const other = await run(settings, { prompts, seed: 8 });
    expect(key(other)).not.toBe(key(a));
  });

  test('budget goes to firing decisions in (tool call, path order), whatever the latencies: granted ones are a prefix', async () => {
    let contended = 0;
    for (let c = 0; c < 6; c++) {
      const r = lcg(c);
      const { result } = await run(
        { budget: 6 + c, initialSamples: 3 + (c % 3), branchProbability: 0.9, branchesPerDecision: 1 + (c % 2), toolCallLimit: 4 },
        { seed: 100 + c, prompts: [0, 1, 2].map((i) => fakePrompt(i + 10 * c)), latency: () => Math.floor(r() * 20), model: { toolRate: 0.12 } },
      );
      for (let p = 0; p < 3; p++) {
        const fired = result.decisions.filter((d) => d.prompt === p && d.fired).sort((x, y) => x.toolCall - y.toolCall || x.path - y.path);
        const firstStarved = fired.findIndex((d) => d.branches === 0);
        if (firstStarved < 0) continue;
        contended++;
        expect(fired.slice(firstStarved).every((d) => d.branches === 0)).toBe(true);
      }
    }
    expect(contended).toBeGreaterThan(5);
  });

  test('every decision uses the window after its own tool result against its trajectory\'s initial window (exact entropy)', async () => {
    const k = 6;
    const { result } = await run({ budget: 10, initialSamples: 4, entropyWindow: k, branchProbability: 0.5, entropyWeight: 0.6 }, { prompts: [0, 1, 2, 3].map(fakePrompt) });
    expect(result.decisions.length).toBeGreaterThan(10);
    let inherited = 0;
    for (const d of result.decisions) {
      const tree = result.trees[d.prompt] as RolloutTree;
      const t = leafOfPath(tree, d.path);
      const seg = segments(t);
      const [s0, e0] = seg[0] as [number, number];
      const [sc, ec] = seg[d.toolCall] as [number, number]; // segment right after result d.toolCall
      // exact: recorded normalised entropies are -sum p ln p / ln V of the full distribution
      const dists = fakeDistributionsAlong(t.tokens);
      for (let i = sc; i < Math.min(ec, sc + k); i++) {
        let h = 0;
        for (const p of dists[i] as Float64Array) if (p > 0) h -= p * Math.log(p);
        expect(t.normEntropies[i]).toBeCloseTo(h / Math.log(VOCAB_SIZE), 6);
      }
      const initial = mean(t.normEntropies, s0, Math.min(e0, s0 + k));
      const after = mean(t.normEntropies, sc, Math.min(ec, sc + k));
      expect(d.initialEntropy).toBeCloseTo(initial, 6);
      expect(d.entropy).toBeCloseTo(after, 6);
      expect(d.deltaEntropy).toBeCloseTo(after - initial, 6);
      expect(d.probability).toBeCloseTo(Math.min(1, Math.max(0, 0.5 + 0.6 * (after - initial))), 6);
      // not the segment that led to the call (the reference's one-step-late reading)
      const [sp, ep] = seg[d.toolCall - 1] as [number, number];
      if (Math.abs(mean(t.normEntropies, sp, Math.min(ep, sp + k)) - after) > 1e-3) expect(Math.abs(d.entropy - mean(t.normEntropies, sp, Math.min(ep, sp + k)))).toBeGreaterThan(1e-4);
      const origin = tree.leaves.find((l) => l.path === d.path)?.origin;
      if (origin === 'branch') inherited++; // its initial window lies in the shared prefix: the trajectory's, inherited
    }
    expect(inherited).toBeGreaterThan(0);
  });

  test('the baseline never leaks across prompts or steps', async () => {
    const settings = { budget: 8, initialSamples: 4, branchProbability: 0.5, entropyWeight: 1 };
    const engine = new FakeEngine();
    const tools = fakeTools();
    const deps: RolloutDeps = { engine, text: fakeText, executeTool: tools.execute, eosTokenIds: [EOS] };
    const decisionsOf = (r: RolloutResult, prompt: number) => r.decisions.filter((d) => d.prompt === prompt).sort((x, y) => x.path - y.path || x.toolCall - y.toolCall);
    // step 1 with other prompts, then step 2 on the same engine: equal to a fresh engine's step 2
    await rollout(deps, [fakePrompt(10), fakePrompt(11)], 5, settings);
    const step2 = await rollout(deps, [fakePrompt(12), fakePrompt(13)], 6, settings);
    const fresh = await rollout({ ...deps, engine: new FakeEngine() }, [fakePrompt(12), fakePrompt(13)], 6, settings);
    expect(step2.decisions.length).toBeGreaterThan(3);
    expect(decisionsOf(step2, 0)).toEqual(decisionsOf(fresh, 0));
    expect(decisionsOf(step2, 1)).toEqual(decisionsOf(fresh, 1));
    // prompt 0's decisions do not depend on which prompt shares its batch
    const withOther = await rollout({ ...deps, engine: new FakeEngine() }, [fakePrompt(12), fakePrompt(14)], 6, settings);
    expect(decisionsOf(withOther, 0)).toEqual(decisionsOf(fresh, 0));
    expect(JSON.stringify((withOther.trees[0] as RolloutTree).toJSON())).toBe(JSON.stringify((fresh.trees[0] as RolloutTree).toJSON()));
  });

  test('paths that finish early are replaced by fresh global samples after all finished, never by copies', async () => {
    const { result, engine } = await run({ budget: 7, initialSamples: 3, branchProbability: 0, entropyWeight: 0, speculativeRefills: false }, { prompts: [fakePrompt(1), fakePrompt(2)] });
    expect(result.metrics.paths).toEqual({ global: 6, branch: 0, refill: 8 });
    for (const tree of result.trees) {
      expect(tree.node(0).children.length).toBe(7);
      const seqs = tree.trajectories().map((t) => Array.from(t.tokens).join(','));
      expect(new Set(seqs).size).toBe(7);
      const streams = tree.leaves.map((l) => l.stream);
      expect(new Set(streams).size).toBe(7);
      // refills start only once every global path of the prompt has finished
      const globalStreams = new Set(tree.leaves.filter((l) => l.origin === 'global').map((l) => l.stream));
      const refillStreams = new Set(tree.leaves.filter((l) => l.origin === 'refill').map((l) => l.stream));
      const lastGlobal = Math.max(...engine.calls.map((c, i) => (c.streams.some((s) => globalStreams.has(s)) ? i : -1)));
      const firstRefill = engine.calls.findIndex((c) => c.streams.some((s) => refillStreams.has(s)));
      expect(firstRefill).toBeGreaterThan(lastGlobal);
    }
  });

  test('speculative refills: the same trees, decisions and tool calls as refills started once every path finished; their tools run only after', async () => {
    const rand = lcg(77);
    let kept = 0;
    let dropped = 0;
    let resultsAfter = 0;
    for (let c = 0; c < 12; c++) {
      const budget = 2 + Math.floor(rand() * 8);
      const settings: Partial<RolloutSettings> = {
        budget,
        initialSamples: 1 + Math.floor(rand() * (budget - 1)),
        branchProbability: rand() * 0.8,
        entropyWeight: rand() - 0.5,
        toolCallLimit: Math.floor(rand() * 4),
        maxBatchPaths: rand() < 0.3 ? 3 : 256,
      };
      const prompts = [0, 1, 2].map((i) => fakePrompt(i + 5 * c));
      const r1 = lcg(c + 1);
      const r2 = lcg(c + 100);
      const plain = await run({ ...settings, speculativeRefills: false }, { prompts, seed: c, latency: () => Math.floor(r1() * 10) });
      const spec = await run({ ...settings, speculativeRefills: true }, { prompts, seed: c, latency: () => Math.floor(r2() * 10) });
      const ctx = JSON.stringify({ c, settings });
      expect({ ctx, trees: spec.result.trees.map((t) => JSON.stringify(t.toJSON())) }).toEqual({ ctx, trees: plain.result.trees.map((t) => JSON.stringify(t.toJSON())) });
      expect(spec.result.decisions).toEqual(plain.result.decisions);
      expect(spec.result.metrics.paths).toEqual(plain.result.metrics.paths);
      expect(spec.result.metrics.toolCalls).toEqual(plain.result.metrics.toolCalls);
      expect(spec.tools.calls.map((x) => x.content).sort()).toEqual(plain.tools.calls.map((x) => x.content).sort());
      expect(spec.engine.livePaths).toBe(0);
      const sp = spec.result.metrics.speculation;
      expect(sp.kept).toBe(plain.result.metrics.paths.refill);
      expect(sp.started).toBe(3 * (budget - (settings.initialSamples as number)));
      kept += sp.kept;
      dropped += sp.started - sp.kept;
      // A refill's first tool result is fed (its call ran) only after every other path of its prompt has had its last engine call.
      const calls = spec.engine.calls;
      for (const tree of spec.result.trees) {
        const refillStreams = new Set(tree.leaves.filter((l) => l.origin === 'refill').map((l) => l.stream));
        const otherStreams = new Set(tree.leaves.filter((l) => l.origin !== 'refill').map((l) => l.stream));
        const lastOther = Math.max(...calls.map((x, i) => (x.streams.some((st) => otherStreams.has(st)) ? i : -1)));
        for (const st of refillStreams) {
          const firstResult = calls.findIndex((x) => x.streams.some((s2, k) => s2 === st && (x.lengths[k] as number) > 1));
          if (firstResult >= 0) {
            expect(firstResult).toBeGreaterThan(lastOther);
            resultsAfter++;
          }
        }
      }
    }
    // Both ways occur: refills kept and speculative work thrown away.
    expect(kept).toBeGreaterThan(5);
    expect(dropped).toBeGreaterThan(5);
    expect(resultsAfter).toBeGreaterThan(3);
  });

  test('over the tool-call limit a path ends at its call: not run, no forced token', async () => {
    const { result, tools } = await run({ budget: 6, initialSamples: 6, toolCallLimit: 1 }, { prompts: [0, 1, 2, 3].map(fakePrompt), model: { toolRate: 0.15, answerRate: 0.005 } });
    const limited = result.trees.flatMap((t) => t.trajectories()).filter((t) => t.finishReason === 'tool_limit');
    expect(limited.length).toBeGreaterThan(3);
    for (const t of limited) {
      const text = fakeText.decode(t.tokens);
      expect(text.endsWith('</search>') || text.endsWith('</python>')).toBe(true);
      expect(t.toolTags.length).toBe(1); // the limit: one result, then the refused call
      expect(t.lossMask[t.tokens.length - 1]).toBe(1); // the last token is the sampled closing tag, not a forced EOS
      expect(Array.from(t.tokens)).not.toContain(EOS);
    }
    const overLimit = Object.values(result.metrics.toolCalls).reduce((a, c) => a + c.overLimit, 0);
    expect(overLimit).toBe(limited.length);
    const executed = Object.values(result.metrics.toolCalls).reduce((a, c) => a + c.executed, 0);
    expect(tools.calls.length).toBe(executed);
    expect(executed).toBeLessThanOrEqual(24);
  });

  test('a tool result that does not fit the response budget ends the path with length', async () => {
    const { result } = await run({ budget: 6, initialSamples: 6, maxResponseTokens: 24 }, { prompts: [0, 1, 2, 3].map(fakePrompt), model: { toolRate: 0.3 } });
    const all = result.trees.flatMap((t) => t.trajectories());
    expect(all.every((t) => t.tokens.length - t.promptLength <= 24)).toBe(true);
    expect(result.metrics.finishReasons.length).toBeGreaterThan(0);
    expect(result.metrics.toolResultsDropped).toBeGreaterThan(0);
  });

  test('trajectory-level baseline: M independent samples through the same engine and tools', async () => {
    const { result } = await run({ mode: 'trajectory', budget: 8 }, { prompts: [0, 1, 2].map(fakePrompt) });
    for (const tree of result.trees) {
      expect(tree.leafCount).toBe(8);
      expect(tree.node(0).children.length).toBe(8);
      expect(tree.leaves.every((l) => l.origin === 'global')).toBe(true);
    }
    expect(result.decisions).toEqual([]);
    expect(result.metrics.branches).toBe(0);
    expect(Object.values(result.metrics.toolCalls).every((c) => c.inherited === 0)).toBe(true);
    expect(result.metrics.leafTokensTotal).toBe(result.metrics.leafTokensUnique);
  });

  test('tool metrics: executed + inherited = calls on the leaves\' paths; unique <= total tokens', async () => {
    const { result, tools } = await run({ budget: 12, initialSamples: 4, branchProbability: 0.9 }, { prompts: [0, 1, 2].map(fakePrompt) });
    const m = result.metrics;
    const onLeaves = new Map<string, number>();
    for (const t of result.trees.flatMap((x) => x.trajectories())) for (const tag of t.toolTags) onLeaves.set(tag, (onLeaves.get(tag) ?? 0) + 1);
    for (const [tag, n] of onLeaves) expect((m.toolCalls[tag]?.executed ?? 0) + (m.toolCalls[tag]?.inherited ?? 0)).toBe(n);
    expect(tools.calls.length).toBe(Object.values(m.toolCalls).reduce((a, c) => a + c.executed, 0));
    expect(Object.values(m.toolCalls).some((c) => c.inherited > 0)).toBe(true);
    expect(m.leafTokensUnique).toBeLessThan(m.leafTokensTotal);
    expect(m.decisions).toBe(result.decisions.length);
    expect(m.decisionsFired).toBe(result.decisions.filter((d: BranchDecision) => d.fired).length);
    // branch events by tool and depth, against the decision records
    const events = result.decisions.filter((x) => x.branches > 0);
    expect(m.branchEvents).toBe(events.length);
    const byTool: Record<string, number> = {};
    const byDepth: Record<string, number> = {};
    for (const e of events) {
      byTool[e.tag] = (byTool[e.tag] ?? 0) + 1;
      byDepth[e.depth] = (byDepth[e.depth] ?? 0) + 1;
    }
    expect(m.branchEventsByTool).toEqual(byTool);
    expect(m.branchEventsByDepth).toEqual(byDepth);
    expect(m.branchDeltaEntropy).toBeCloseTo(events.reduce((a, e) => a + e.deltaEntropy, 0) / events.length, 10);
    expect(m.entropyAfterTool.search).toBeGreaterThan(m.entropyBeforeTool.search as number); // the fake agent is less sure after search results
  });

  test('continuous batching: decoding continues while tools run; tool calls overlap', async () => {
    let inFlight = 0;
    let maxInFlight = 0;
    let callsDuringTools = 0;
    const engine = new FakeEngine();
    const base = engine.extend.bind(engine);
    engine.extend = async (...args) => {
      if (inFlight > 0) callsDuringTools++;
      return base(...args);
    };
    const tools = fakeTools(() => 25);
    const executeTool = async (tag: string, content: string, signal: AbortSignal) => {
      inFlight++;
      maxInFlight = Math.max(maxInFlight, inFlight);
      try {
        return await tools.execute(tag, content, signal);
      } finally {
        inFlight--;
      }
    };
    const r = await rollout({ engine, text: fakeText, executeTool, eosTokenIds: [EOS] }, [0, 1, 2, 3].map(fakePrompt), 3, { budget: 6, initialSamples: 3 });
    expect(callsDuringTools).toBeGreaterThan(r.metrics.engineCalls / 4); // decoding went on while tools ran
    expect(maxInFlight).toBeGreaterThanOrEqual(3); // calls of different paths overlap
  });

  test('reference-compatible top-k entropy estimate, and a clear error when the engine cannot provide it', async () => {
    const k = 5;
    const { result } = await run({ budget: 8, initialSamples: 4, entropyEstimate: 'top-k', entropyTopK: 3, entropyWindow: k });
    expect(result.decisions.length).toBeGreaterThan(3);
    for (const d of result.decisions) {
      const t = leafOfPath(result.trees[d.prompt] as RolloutTree, d.path);
      const seg = segments(t);
      const dists = fakeDistributionsAlong(t.tokens);
      const est = (i: number) => {
        const lp = Array.from(dists[i] as Float64Array, (p) => (p > 0 ? Math.log(p) : -Infinity)).sort((a, b) => b - a).slice(0, 3);
        return lp.reduce((a, l) => a - (l > -Infinity ? Math.exp(l) * l : 0), 0) / Math.log(VOCAB_SIZE);
      };
      const win = (s: [number, number]) => {
        const xs: number[] = [];
        for (let i = s[0]; i < Math.min(s[1], s[0] + k); i++) xs.push(est(i));
        return xs.reduce((a, b) => a + b, 0) / xs.length;
      };
      expect(d.initialEntropy).toBeCloseTo(win(seg[0] as [number, number]), 5);
      expect(d.entropy).toBeCloseTo(win(seg[d.toolCall] as [number, number]), 5);
    }
    const engine = new FakeEngine();
    const base = engine.extend.bind(engine);
    engine.extend = async (paths, inputs, sampling) => {
      const r = await base(paths, inputs, sampling);
      return { tokens: r.tokens, logprobs: r.logprobs, entropies: r.entropies, normEntropies: r.normEntropies };
    };
    await expect(rollout({ engine, text: fakeText, executeTool: fakeTools().execute, eosTokenIds: [EOS] }, [fakePrompt(0)], 1, { entropyEstimate: 'top-k' })).rejects.toThrow(
      "rollout: entropyEstimate 'top-k' needs an engine that returns topLogprobs",
    );
    expect(engine.livePaths).toBe(0);
  });
});

describe('failures', () => {
  test('an engine failure rejects the rollout, aborts tools and frees every path', async () => {
    const engine = new FakeEngine();
    const base = engine.extend.bind(engine);
    let n = 0;
    engine.extend = async (...args) => {
      if (++n === 12) throw new Error('device lost');
      return base(...args);
    };
    let aborted = 0;
    const tools = fakeTools(() => 50);
    const executeTool = (tag: string, content: string, signal: AbortSignal) => {
      signal.addEventListener('abort', () => aborted++, { once: true });
      return tools.execute(tag, content, signal);
    };
    await expect(rollout({ engine, text: fakeText, executeTool, eosTokenIds: [EOS] }, [0, 1, 2].map(fakePrompt), 1, { budget: 4, initialSamples: 2 })).rejects.toThrow('device lost');
    expect(engine.livePaths).toBe(0);
    expect(aborted).toBe(tools.calls.length);
  });

  test('a failing tool feeds its error back as the result and the rollout goes on', async () => {
    const engine = new FakeEngine();
    const tools = fakeTools();
    const executeTool = (tag: string, content: string, signal: AbortSignal) => (tag === 'python' ? Promise.reject(new Error('sandbox exploded')) : tools.execute(tag, content, signal));
    const r = await rollout({ engine, text: fakeText, executeTool, eosTokenIds: [EOS] }, [0, 1, 2, 3].map(fakePrompt), 1, { budget: 4, initialSamples: 4 });
    const py = r.metrics.toolCalls.python;
    expect(py?.executed).toBeGreaterThan(0);
    expect(py?.failed).toBe(py?.executed);
    const results = r.trees.flatMap((t) => t.nodes.filter((n) => n.tool?.tag === 'python'));
    for (const n of results) {
      expect(fakeText.decode(n.tokens)).toBe(' <result>\nError: sandbox exploded\n</result>');
      expect(n.tool?.ok).toBe(false);
    }
    expect(r.trees.every((t) => t.leafCount === 4)).toBe(true);
  });

  test('bad arguments are named', async () => {
    const deps: RolloutDeps = { engine: new FakeEngine(), text: fakeText, executeTool: fakeTools().execute, eosTokenIds: [EOS] };
    await expect(rollout(deps, [], 1)).rejects.toThrow('Expected a non-empty array of prompts for prompts but received Array(0) of type array');
    await expect(rollout(deps, [[1, 2], []], 1)).rejects.toThrow('Expected a non-empty array of token ids for prompts[1] but received Array(0) of type array');
    await expect(rollout(deps, [[1, 9999]], 1)).rejects.toThrow(`Expected a token id in [0, ${VOCAB_SIZE}) for prompts[0][1] but received 9999 of type number`);
    await expect(rollout(deps, [[1]], -1)).rejects.toThrow('Expected a non-negative safe integer or bigint for seed but received -1 of type number');
    await expect(rollout({ ...deps, executeTool: 'x' as never }, [[1]], 1)).rejects.toThrow('Expected a function (tag, content, signal) for deps.executeTool but received "x" of type string');
    await expect(rollout(deps, [[1]], 1, { initialSamples: 0 })).rejects.toThrow('Expected an integer >= 1 for initialSamples but received 0 of type number');
  });
});

describe('where the time goes (slot accounting and the trace)', () => {
  const sum = (xs: readonly number[]): number => xs.reduce((a, b) => a + b, 0);

  test.each(['arpo', 'trajectory'] as const)('%s: the trace adds up to the metrics; every tool wait is a tool slot', async (mode) => {
    const { result, engine } = await run({ mode, budget: 6, initialSamples: 2, branchProbability: 1, toolCallLimit: 3, trace: true, speculativeRefills: true }, { latency: () => 25 });
    const m = result.metrics;
    const t = result.trace!;
    expect(t.engineCalls).toHaveLength(m.engineCalls);
    // Each call's attention keys against the engine's own cached lengths.
    expect(t.engineCalls.map((c) => c.keys)).toEqual(engine.calls.map((c) => c.keys));
    expect(sum(t.engineCalls.map((c) => c.rows))).toBe(m.engineRows);
    expect(sum(t.engineCalls.map((c) => c.tokens))).toBe(m.tokensComputed);
    expect(sum(t.engineCalls.map((c) => c.ms))).toBeCloseTo(m.modelMs, 6);
    const executed = sum(Object.values(m.toolCalls).map((c) => c.executed));
    expect(executed).toBeGreaterThan(0);
    expect(t.toolCalls).toHaveLength(executed);
    expect(sum(t.toolCalls.map((c) => c.ms))).toBeCloseTo(m.toolMs, 6);
    // Engine calls are in time order and do not overlap.
    for (let i = 1; i < t.engineCalls.length; i++) expect(t.engineCalls[i]!.atMs).toBeGreaterThanOrEqual(t.engineCalls[i - 1]!.atMs + t.engineCalls[i - 1]!.ms - 1e-6);
    // Rows in the calls are decode slots: the decode slot-time is exactly the rows weighted by each call's time (prefills aside).
    expect(m.slotMs.decode).toBeCloseTo(sum(t.engineCalls.map((c) => (c.rows - c.prefills - c.speculative) * c.ms)), 6);
    if (mode === 'arpo') expect(sum(t.engineCalls.map((c) => c.speculative))).toBeGreaterThan(0);
    else expect(m.slotMs.speculative).toBe(0);
    // A tool call of 25 ms holds its path's slot that long: the scheduler accounts it in engine calls and waits,
    // missing only its own JS time between them.
    expect(m.slotMs.tool).toBeLessThanOrEqual(m.toolMs + 1e-6);
    expect(m.slotMs.tool).toBeGreaterThan(0.5 * m.toolMs);
    expect(m.toolWaitMs).toBeLessThanOrEqual(m.wallMs);
    if (mode === 'trajectory') {
      // No branches, every path starts at once: nothing waits for a grant, and only the prompt prefill leaves slots unused.
      expect(m.slotMs.grant).toBe(0);
      expect(m.slotMs.unused).toBeLessThanOrEqual(3 * 6 * sum(t.engineCalls.filter((c) => c.prefills > 0).map((c) => c.ms)) + 1e-6); // 3 prompts x 6 slots
    } else {
      // 2 of 6 paths start; the other 4 slots wait for branches (or a refill) for much of the rollout.
      expect(m.slotMs.grant + m.slotMs.speculative + m.slotMs.unused).toBeGreaterThan(0);
    }
  });

  test('without trace the result has none, and the slot time is still there', async () => {
    const { result } = await run({ budget: 4, initialSamples: 2 }, { latency: () => 5 });
    expect(result.trace).toBeUndefined();
    expect(result.metrics.engineRows).toBeGreaterThanOrEqual(result.metrics.engineCalls);
    expect(result.metrics.slotMs.decode).toBeGreaterThanOrEqual(0);
    await expect(rollout({ engine: new FakeEngine({}), text: fakeText, executeTool: fakeTools().execute, eosTokenIds: [EOS] }, [fakePrompt(0)], 1, { trace: 'yes' as never })).rejects.toThrow(/true or false for trace/);
  });
});
