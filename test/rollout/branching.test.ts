// The branch decision's pieces: counter-based hashes (against SplitMix64's
// published outputs and the C++ rng.h), P_t and both rules (bernoulli
// frequency against its formula over many decisions), the top-k entropy
// estimate, entropy windows, stop detection and settings validation.
import { execFileSync } from 'child_process';
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import {
  branchFires,
  branchProbability,
  decisionUniform,
  EntropyWindow,
  mix64,
  pathStream,
  seedToU64,
  topKEntropy,
  uniformFromKey,
} from '../../lib/rollout/branching';
import { DEFAULT_ROLLOUT_SETTINGS, resolveRolloutSettings } from '../../lib/rollout/settings';
import { stopCompletedBy } from '../../lib/rollout/stops';
import { fakeText, lcg } from './fake-engine';

const GOLDEN = 0x9e3779b97f4a7c15n;

describe('counter-based hashes', () => {
  test('mix64 reproduces SplitMix64 (seed 0) published outputs', () => {
    // SplitMix64 output n = finaliser(state + n·golden); mix64 adds the golden ratio itself.
    expect(mix64(0n)).toBe(0xe220a8397b1dcdafn);
    expect(mix64(GOLDEN)).toBe(0x6e789e6aa1b965f4n);
    expect(mix64((2n * GOLDEN) & ((1n << 64n) - 1n))).toBe(0x06c45d188009454fn);
  });

  test('mix64 and uniform agree bit for bit with native/kernels/rng.h', () => {
    const header = path.resolve(__dirname, '../../native/kernels/rng.h');
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-rng-'));
    try {
      const src = path.join(dir, 'rng.cc');
      fs.writeFileSync(
        src,
        `#include "${header}"\n#include <cstdio>\nint main(){ for (unsigned long long i = 0; i < 64; i++) { unsigned long long x = i * 0x0123456789ABCDEFull + (i << 60); std::printf("%llu %.17g\\n", (unsigned long long)arpo::rng::mix64(x), arpo::rng::uniform(x, 0)); } }\n`,
      );
      try {
        execFileSync('g++', ['-std=c++17', '-O1', '-o', path.join(dir, 'rng'), src], { stdio: 'pipe' });
      } catch (e) {
        console.warn(`g++ unavailable, rng.h cross-check skipped: ${(e as Error).message.split('\n')[0]}`);
        return;
      }
      const lines = execFileSync(path.join(dir, 'rng'), { encoding: 'utf8' }).trim().split('\n');
      const M = (1n << 64n) - 1n;
      lines.forEach((line, i) => {
        const [m, u] = line.split(' ');
        const x = (BigInt(i) * 0x0123456789abcdefn + (BigInt(i) << 60n)) & M;
        expect(mix64(x).toString()).toBe(m);
        // rng::uniform(key, 0) = 53 bits of mix64(key + 0) -> (bits + 0.5) / 2^53
        expect(uniformFromKey(x)).toBe(Number(u));
      });
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  test('decision uniforms are deterministic, key-sensitive and uniform (Kolmogorov-Smirnov)', () => {
    const seed = 1234n;
    expect(decisionUniform(seed, 3, 7, 2)).toBe(decisionUniform(seed, 3, 7, 2));
    const variants = [decisionUniform(seed, 3, 7, 2), decisionUniform(seed + 1n, 3, 7, 2), decisionUniform(seed, 4, 7, 2), decisionUniform(seed, 3, 8, 2), decisionUniform(seed, 3, 7, 3)];
    expect(new Set(variants).size).toBe(variants.length);
    const u: number[] = [];
    for (let p = 0; p < 20; p++) for (let q = 0; q < 50; q++) for (let c = 1; c <= 20; c++) u.push(decisionUniform(seed, p, q, c));
    u.sort((a, b) => a - b);
    let d = 0;
    u.forEach((x, i) => (d = Math.max(d, Math.abs(x - i / u.length), Math.abs(x - (i + 1) / u.length))));
    expect(d).toBeLessThan(1.63 / Math.sqrt(u.length)); // KS critical value at the 1% level
    expect(u[0] as number).toBeGreaterThan(0);
    expect(u[u.length - 1] as number).toBeLessThan(1);
  });

  test('path streams are (prompt, order) packed and unique', () => {
    expect(pathStream(0, 0)).toBe(0n);
    expect(pathStream(3, 5)).toBe((3n << 32n) + 5n);
    expect(() => pathStream(-1, 0)).toThrow('Expected a prompt index in [0, 2^31) for prompt but received -1 of type number');
    expect(() => seedToU64(-3)).toThrow('Expected a non-negative safe integer or bigint for seed but received -3 of type number');
    expect(seedToU64(7)).toBe(7n);
  });
});

describe('branch rule', () => {
  test('P_t = clamp(alpha + beta * dH, 0, 1)', () => {
    expect(branchProbability(0.5, 0.2, 0.25)).toBeCloseTo(0.55, 15);
    expect(branchProbability(0.5, 0.2, -0.5)).toBeCloseTo(0.4, 15);
    expect(branchProbability(0.9, 1, 0.5)).toBe(1);
    expect(branchProbability(0.1, 1, -0.5)).toBe(0);
  });

  test('threshold rule fires exactly when P_t > tau', () => {
    expect(branchFires('threshold', 0.51, 0.5, NaN)).toBe(true);
    expect(branchFires('threshold', 0.5, 0.5, NaN)).toBe(false);
    expect(branchFires('threshold', 0.2, 0.1, NaN)).toBe(true);
  });

  test('bernoulli rule: branch frequency matches sum of P_t over 40,000 decisions, overall and per probability bin', () => {
    const rand = lcg(99);
    const seed = 42n;
    const bins = Array.from({ length: 10 }, () => ({ n: 0, fired: 0, p: 0, var: 0 }));
    let fired = 0;
    let expected = 0;
    let variance = 0;
    for (let i = 0; i < 40000; i++) {
      const dH = rand() * 2 - 1; // ΔH in [-1, 1]
      const p = branchProbability(0.5, 0.4, dH);
      const f = branchFires('bernoulli', p, 0.5, decisionUniform(seed, i % 97, Math.floor(i / 97), 1 + (i % 5)));
      fired += f ? 1 : 0;
      expected += p;
      variance += p * (1 - p);
      const b = bins[Math.min(9, Math.floor(p * 10))] as (typeof bins)[number];
      b.n++;
      b.fired += f ? 1 : 0;
      b.p += p;
      b.var += p * (1 - p);
    }
    expect(Math.abs(fired - expected)).toBeLessThan(5 * Math.sqrt(variance));
    for (const b of bins) if (b.n > 0) expect(Math.abs(b.fired - b.p)).toBeLessThan(5 * Math.sqrt(b.var) + 1);
    // the reference's reading: u − β·ΔH ≤ α, identical decisions
    const u = decisionUniform(seed, 1, 2, 3);
    for (const dH of [-0.7, -0.1, 0, 0.2, 0.9]) expect(branchFires('bernoulli', branchProbability(0.5, 0.2, dH), 0.5, u)).toBe(u - 0.2 * dH <= 0.5);
  });
});

describe('entropy estimates and windows', () => {
  test('top-k estimate equals -sum p log p over the k largest and never exceeds the exact entropy', () => {
    const rand = lcg(5);
    const V = 300;
    const logits = Array.from({ length: V }, () => rand() * 6);
    const lse = Math.log(logits.reduce((a, z) => a + Math.exp(z), 0));
    const lp = logits.map((z) => z - lse).sort((a, b) => b - a);
    let exact = 0;
    for (const l of lp) exact -= Math.exp(l) * l;
    let naive10 = 0;
    for (let i = 0; i < 10; i++) naive10 -= Math.exp(lp[i] as number) * (lp[i] as number);
    const buf = new Float32Array([0, 0, ...lp.slice(0, 10)]);
    expect(topKEntropy(buf, 2, 10, V)).toBeCloseTo(naive10 / Math.log(V), 6);
    expect(topKEntropy(Float32Array.from(lp), 0, V, V)).toBeCloseTo(exact / Math.log(V), 5);
    expect(topKEntropy(buf, 2, 10, V)).toBeLessThan(exact / Math.log(V));
  });

  test('a window averages the first k values only; empty means 0 (entropy_delta semantics)', () => {
    const w = new EntropyWindow(3);
    expect(w.mean).toBe(0);
    expect(w.add(0.1)).toBe(false);
    expect(w.add(0.2)).toBe(false);
    expect(w.add(0.6)).toBe(true);
    expect(w.add(5)).toBe(false);
    expect(w.count).toBe(3);
    expect(w.mean).toBeCloseTo(0.3, 15);
  });
});

describe('stop detection', () => {
  const stops = ['</search>', '</python>', '</answer>'];
  const enc = (s: string) => Array.from(fakeText.encode(s));
  test('fires on the token that completes a stop string, once', () => {
    const toks = enc(' the<search> who is king</se');
    expect(stopCompletedBy(toks, fakeText, stops)).toBeUndefined();
    for (const c of 'arch') {
      toks.push(...enc(c));
      expect(stopCompletedBy(toks, fakeText, stops)).toBeUndefined();
    }
    toks.push(...enc('>'));
    expect(stopCompletedBy(toks, fakeText, stops)).toBe('</search>');
    toks.push(...enc(' x'));
    expect(stopCompletedBy(toks, fakeText, stops)).toBeUndefined();
  });
  test('a stop string inside one token and long segments', () => {
    const toks = enc(' alpha'.repeat(100) + '<answer> two</answer>');
    expect(stopCompletedBy(toks, fakeText, stops)).toBe('</answer>');
    expect(stopCompletedBy([], fakeText, stops)).toBeUndefined();
  });
});

describe('settings', () => {
  test('defaults are the reference scripts', () => {
    const s = resolveRolloutSettings();
    expect(s).toEqual(DEFAULT_ROLLOUT_SETTINGS);
    expect([s.budget, s.initialSamples, s.branchesPerDecision, s.branchProbability, s.entropyWeight, s.branchRule, s.entropyWindow]).toEqual([16, 8, 1, 0.5, 0.2, 'bernoulli', 20]);
    expect(Object.isFrozen(s)).toBe(true);
    expect(resolveRolloutSettings({ mode: 'trajectory', budget: 4 }).initialSamples).toBe(4);
  });
  test('bad fields are named with their values', () => {
    expect(() => resolveRolloutSettings({ budget: 0 })).toThrow('Expected an integer >= 1 for budget but received 0 of type number');
    expect(() => resolveRolloutSettings({ budget: 4, initialSamples: 5 })).toThrow('Expected an integer in [1, budget = 4] for initialSamples but received 5 of type number');
    expect(() => resolveRolloutSettings({ branchProbability: 1.5 })).toThrow('Expected a number in [0, 1] for branchProbability but received 1.5 of type number');
    expect(() => resolveRolloutSettings({ branchRule: 'coin' as never })).toThrow('Unknown branchRule "coin"; known: bernoulli, threshold');
    expect(() => resolveRolloutSettings({ topP: 0 })).toThrow('Expected a number in (0, 1] for topP but received 0 of type number');
    expect(() => resolveRolloutSettings({ budgets: 3 } as never)).toThrow('Unknown rollout setting "budgets"');
    expect(() => resolveRolloutSettings({ entropyWindow: 2.5 })).toThrow('Expected an integer >= 1 for entropyWindow but received 2.5 of type number');
  });
});
