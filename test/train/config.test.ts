// Run configuration: defaults, validation messages naming the option path, --set overrides, YAML/JSON files.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { OPTIONS, defaultConfig, describeOptions, loadConfig, parseOverride, validateConfig } from '../../lib/train/config';

describe('run config', () => {
  test('defaults follow the reference scripts and every default passes its own schema', () => {
    const c = defaultConfig();
    expect(c.rollout.budget).toBe(16);
    expect(c.rollout.initialSamples).toBe(8);
    expect(c.rollout.branchesPerDecision).toBe(1);
    expect(c.rollout.branchProbability).toBe(0.5);
    expect(c.rollout.entropyWeight).toBe(0.2);
    expect(c.rollout.branchRule).toBe('bernoulli');
    expect(c.rollout.entropyWindow).toBe(20);
    expect(c.rollout.toolCallLimit).toBe(5);
    expect(c.loss.klCoef).toBe(0);
    expect(c.optim.lr).toBe(1e-6);
    for (const [p, spec] of Object.entries(OPTIONS)) {
      expect([p, (spec.schema as { safeParse(v: unknown): { success: boolean } }).safeParse(spec.default).success]).toEqual([p, true]);
    }
  });

  test('algorithm presets set defaults that explicit options override', () => {
    const dapo = validateConfig({ algorithm: { name: 'dapo' } });
    expect(dapo.rollout.mode).toBe('trajectory');
    expect(dapo.loss.clipHigh).toBe(0.28);
    expect(dapo.algorithm.dynamicSampling).toBe(true);
    const grpo = validateConfig({ algorithm: { name: 'grpo' }, loss: { clipHigh: 0.3 } });
    expect(grpo.rollout.mode).toBe('trajectory');
    expect(grpo.loss.clipHigh).toBe(0.3);
    expect(validateConfig({ algorithm: { name: 'reinforce++' } }).algorithm.estimator).toBe('reinforce++');
    expect(validateConfig({}).rollout.mode).toBe('arpo');
    expect(() => validateConfig({ algorithm: { name: 'ppo' } })).toThrow(/algorithm\.name/);
  });

  test('the result is frozen', () => {
    const c = defaultConfig();
    expect(Object.isFrozen(c)).toBe(true);
    expect(Object.isFrozen(c.rollout)).toBe(true);
    expect(() => {
      (c.rollout as { budget: number }).budget = 3;
    }).toThrow();
  });

  test('bad values name the option path and the value', () => {
    expect(() => validateConfig({ rollout: { branchProbability: 1.5 } })).toThrow(/rollout\.branchProbability.*1\.5/);
    expect(() => validateConfig({ rollout: { budget: 0 } })).toThrow(/rollout\.budget.*received 0/);
    expect(() => validateConfig({ loss: { aggregation: 'mean' } })).toThrow(/loss\.aggregation.*"mean"/);
    expect(() => validateConfig({ rollout: { budget: 4, initialSamples: 8 } })).toThrow(/rollout\.initialSamples: 8 exceeds rollout\.budget 4/);
    expect(() => validateConfig({ rollout: { budgett: 4 } })).toThrow(/unknown option rollout\.budgett/);
    expect(() => validateConfig({ budget: 4 })).toThrow(/did you mean rollout\.budget/);
    expect(() => validateConfig([])).toThrow(/expected an object/);
  });

  test('--set parses numbers, booleans, null and strings by the option', () => {
    expect(parseOverride('rollout.budget=8')).toEqual({ path: 'rollout.budget', value: 8 });
    expect(parseOverride('data.shuffle=false')).toEqual({ path: 'data.shuffle', value: false });
    expect(parseOverride('model.path=null')).toEqual({ path: 'model.path', value: null });
    expect(parseOverride('train.outDir=runs/x=1')).toEqual({ path: 'train.outDir', value: 'runs/x=1' });
    expect(parseOverride('model.path=123')).toEqual({ path: 'model.path', value: '123' });
    expect(() => parseOverride('nope')).toThrow(/key=value/);
    expect(() => parseOverride('rollout.nope=1')).toThrow(/unknown option rollout\.nope/);
  });

  test('YAML and JSON files, with overrides applied last', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-config-'));
    const y = path.join(dir, 'run.yaml');
    fs.writeFileSync(y, 'rollout:\n  budget: 8\n  initialSamples: 4\nloss:\n  clipHigh: 0.28\n');
    const c = loadConfig(y, ['rollout.budget=12']);
    expect(c.rollout.budget).toBe(12);
    expect(c.rollout.initialSamples).toBe(4);
    expect(c.loss.clipHigh).toBe(0.28);
    const j = path.join(dir, 'run.json');
    fs.writeFileSync(j, '{"train": {"steps": 3}');
    expect(() => loadConfig(j)).toThrow(/run\.json: not valid JSON/);
    fs.writeFileSync(j, '{"train": {"steps": -3}}');
    expect(() => loadConfig(j)).toThrow(/run\.json: invalid train\.steps/);
    expect(() => loadConfig(path.join(dir, 'missing.json'))).toThrow(/cannot read config file/);
    fs.rmSync(dir, { recursive: true, force: true });
  });

  test('help lists every option with its default', () => {
    const help = describeOptions();
    for (const p of Object.keys(OPTIONS)) expect(help).toContain(p);
    expect(help).toMatch(/rollout\.budget\s+16\s+M: trajectories/);
  });
});
