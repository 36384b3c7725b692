// The rewards registry and the hierarchical reward: R = max(Acc + r_M, Acc) /
// 0 / -1 (ARPO.md section 3) over any accuracy and format check; user rewards
// by registerReward and from a module file.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';
import { computeReward, deepResearchReward, getReward, hierarchicalReward, loadRewardModule, registerReward, rewardNames } from '../../lib/reward';
import { validateConfig } from '../../lib/train/config';
import { buildReward } from '../../lib/train/setup';

const both = '<search>q</search><result>r</result><python>x</python><result>1</result>';
const resp = (answer: string, tools = '') => `<think>t</think>${tools}<answer>\\boxed{${answer}}</answer>`;

describe('hierarchical reward', () => {
  test('the default equals the reference deep-research reward on QA rows', async () => {
    for (const [r, gt] of [
      [resp('Paris France'), 'Paris'],
      [resp('Paris', both), 'Paris'],
      [resp('Rome', both), 'Paris'],
      ['<think>t</think><answer>Paris</answer>', 'Paris'],
    ] as const) {
      const h = await computeReward('hierarchical', { response: r, groundTruth: gt, ability: 'qa' });
      expect(h.score).toBeCloseTo(deepResearchReward({ response: r, groundTruth: gt }).score, 15);
    }
  });

  test('math rows use equivalence for Acc: 1 (+ r_M) or 0', async () => {
    expect((await computeReward('hierarchical', { response: resp('\\frac{1}{2}'), groundTruth: '0.5', ability: 'math' })).score).toBe(1);
    expect((await computeReward('hierarchical', { response: resp('0.5', both), groundTruth: '\\dfrac12', ability: 'math' })).score).toBeCloseTo(1.1, 15);
    expect((await computeReward('hierarchical', { response: resp('0.6', both), groundTruth: '0.5', ability: 'math' })).score).toBe(0);
    // The reference's F1 would give "1/2" vs "0.5" nothing; equivalence gives 1.
    expect(deepResearchReward({ response: resp('1/2'), groundTruth: '0.5' }).score).toBe(0);
  });

  test('r_M is configurable, and max(Acc + r_M, Acc) never lowers a right answer', () => {
    const acc = (a: string) => (a === 'yes' ? 0.6 : 0);
    const plus = hierarchicalReward({ accuracy: acc, multiToolBonus: 0.25 });
    const minus = hierarchicalReward({ accuracy: acc, multiToolBonus: -0.3 });
    expect(plus({ response: resp('yes', both), groundTruth: '' }).score).toBeCloseTo(0.85, 15);
    expect(plus({ response: resp('yes'), groundTruth: '' }).score).toBeCloseTo(0.6, 15);
    expect(minus({ response: resp('yes', both), groundTruth: '' }).score).toBeCloseTo(0.6, 15);
    expect(plus({ response: resp('no', both), groundTruth: '' }).score).toBe(0);
    expect(plus({ response: '<answer>\\boxed{yes}</answer>', groundTruth: '' }).score).toBe(-1);
  });

  test('any format check and extraction plug in', () => {
    const r = hierarchicalReward({
      format: (s) => ({ ok: s.startsWith('ANSWER:'), reason: 'needs ANSWER:' }),
      extractAnswer: (s) => s.slice('ANSWER:'.length).trim(),
      accuracy: (a, input) => (a === input.groundTruth ? 1 : 0),
      bonusApplies: () => false,
    });
    expect(r({ response: 'ANSWER: 42', groundTruth: '42' })).toMatchObject({ score: 1, formatOk: true, answer: '42' });
    expect(r({ response: '42', groundTruth: '42' })).toMatchObject({ score: -1, formatOk: false, reason: 'bad format: needs ANSWER:' });
    expect(() => hierarchicalReward({ multiToolBonus: Number.NaN })).toThrow('Expected a finite number for multiToolBonus but received NaN of type number');
  });
});

describe('rewards registry', () => {
  test('built-ins are registered; unknown names list them', () => {
    expect(rewardNames()).toEqual(expect.arrayContaining(['arpo-deep-research', 'hierarchical', 'math']));
    expect(() => getReward('f1')).toThrow(/^Unknown reward "f1"; known: .*arpo-deep-research, hierarchical, math/);
  });

  test("a run's reward.badFormatScore and reward.multiToolBonus reach the built-ins; the defaults are the reference's", async () => {
    const bad = '<think>t</think><answer>Paris</answer>'; // no \\boxed{}: fails the format check
    const broken = '<think>t</think><answer>\\boxed{Paris</answer>'; // passes the check, no extractable box
    const right = resp('Paris', both);
    for (const name of ['arpo-deep-research', 'hierarchical']) {
      const reference = await buildReward(validateConfig({ reward: { name } }));
      const input = (response: string) => ({ response, groundTruth: 'Paris', ability: 'qa' });
      expect(await reference(input(bad))).toMatchObject({ score: -1, formatOk: false });
      expect(await reference(input(right))).toMatchObject({ score: 1.1, accuracy: 1 });
      const custom = await buildReward(validateConfig({ reward: { name, badFormatScore: 0, multiToolBonus: 0.25 } }));
      expect(await custom(input(bad))).toMatchObject({ score: 0, formatOk: false, accuracy: 0 });
      expect(await custom(input(broken))).toMatchObject({ score: 0, formatOk: false, accuracy: 0 });
      expect(await custom(input(right))).toMatchObject({ score: 1.25, formatOk: true, accuracy: 1 });
      expect(await custom(input(resp('Rome', both)))).toMatchObject({ score: 0, formatOk: true });
    }
    // The plain functions take the same options.
    expect(deepResearchReward({ response: bad, groundTruth: 'Paris' }, { badFormatScore: -0.5 }).score).toBe(-0.5);
    expect(hierarchicalReward({ badFormatScore: 0.5 })({ response: bad, groundTruth: 'Paris' }).score).toBe(0.5);
    expect(() => hierarchicalReward({ badFormatScore: Number.POSITIVE_INFINITY })).toThrow('Expected a finite number for badFormatScore but received Infinity');
    expect(() => validateConfig({ reward: { badFormatScore: 'low' } })).toThrow(/reward\.badFormatScore/);
    // A user's replacement of a built-in name is used as registered, options or not.
    registerReward('hierarchical', () => 7, { replace: true });
    try {
      expect(await (await buildReward(validateConfig({ reward: { name: 'hierarchical', badFormatScore: 0 } })))({ response: bad, groundTruth: 'Paris' })).toBe(7);
    } finally {
      registerReward('hierarchical', hierarchicalReward(), { replace: true });
    }
  });

  test('registerReward: sync and async functions, numbers or results; bad scores are rejected', async () => {
    registerReward('length-penalty', (input) => -input.response.length / 100);
    registerReward('async-judge', async (input) => ({ score: input.response.includes('42') ? 1 : 0, formatOk: true, accuracy: 1, answer: '42', reason: 'judge' }));
    expect((await computeReward('length-penalty', { response: 'x'.repeat(50), groundTruth: '' })).score).toBe(-0.5);
    expect(await computeReward('async-judge', { response: 'it is 42', groundTruth: '' })).toMatchObject({ score: 1, reason: 'judge' });
    expect(() => registerReward('math', () => 0)).toThrow(/already registered/);
    registerReward('nan', () => Number.NaN);
    await expect(computeReward('nan', { response: '', groundTruth: '' })).rejects.toThrow('Expected a finite number for the score of reward "nan" but received NaN of type number');
    expect(() => registerReward('bad name!', () => 0)).toThrow(/for name but received "bad name!"/);
  });

  test('loadRewardModule registers a default export or a rewards table from a user file', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'arpo-reward-'));
    try {
      const single = path.join(dir, 'exact-match.js');
      fs.writeFileSync(single, 'module.exports = (input) => (input.response.trim() === input.groundTruth ? 1 : 0);\n');
      const table = path.join(dir, 'table.js');
      fs.writeFileSync(table, 'exports.rewards = { "starts-with": (i) => (i.response.startsWith(i.groundTruth) ? 1 : 0), "always-half": () => 0.5 };\n');
      const empty = path.join(dir, 'empty.js');
      fs.writeFileSync(empty, 'exports.x = 1;\n');
      expect(loadRewardModule(single, { name: 'exact-match' })).toEqual(['exact-match']);
      expect(loadRewardModule(table)).toEqual(['starts-with', 'always-half']);
      expect((await computeReward('exact-match', { response: ' Paris ', groundTruth: 'Paris' })).score).toBe(1);
      expect((await computeReward('starts-with', { response: 'Paris!', groundTruth: 'Par' })).score).toBe(1);
      expect(() => loadRewardModule(empty)).toThrow(/exports no reward/);
      expect(() => loadRewardModule(path.join(dir, 'missing.js'))).toThrow(/Cannot load reward module/);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
