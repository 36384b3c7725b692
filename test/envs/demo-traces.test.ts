// Demo SFT traces: protocol well-formedness (independent checker), tool results that are real tool
// output (re-run, python checked by python3), labelled flaws at the configured rates, reward scores.
import { generateCorpus } from '../../lib/envs/demo/corpus';
import { localPython, localRunTool, localSearch } from '../../lib/envs/demo/local-tools';
import { generateQuestions } from '../../lib/envs/demo/questions';
import { FLAWS, generateTraces, type SftTrace } from '../../lib/envs/demo/traces';
import { generateWorld, SPLITS } from '../../lib/envs/demo/world';
import { deepResearchReward } from '../../lib/reward/deep-research';
import { boxedAnswer, formatViolation, pythonEval, pythonRun } from './helpers';

const SEED = 5;
const world = generateWorld(SEED);
const corpus = generateCorpus(world);
const questions = generateQuestions(world);
const allQuestions = SPLITS.flatMap((s) => questions[s]);
const NO_FLAWS = { wrong_answer: 0, skipped_tool: 0, extra_search: 0, off_query: 0, bad_format: 0 };

let flawed: SftTrace[];
let clean: SftTrace[];
beforeAll(async () => {
  flawed = await generateTraces(questions.train, world, localRunTool(corpus), { seed: SEED });
  clean = await generateTraces(allQuestions, world, localRunTool(corpus), { seed: SEED, flawRates: NO_FLAWS });
});

const assistant = (t: SftTrace) => t.messages[2];

describe('demo traces', () => {
  it('are deterministic for a seed', async () => {
    const again = await generateTraces(questions.train.slice(0, 100), world, localRunTool(corpus), { seed: SEED });
    expect(again).toEqual(flawed.slice(0, 100));
  });

  it('without flaws: well-formed, grounded, right answer, every needed tool used', () => {
    expect(clean).toHaveLength(allQuestions.length);
    for (const t of clean) {
      const text = assistant(t).content;
      expect(formatViolation(text)).toBeNull();
      expect(boxedAnswer(text)).toBe(t.groundTruth);
      expect(t.correct && t.wellFormed && t.grounded).toBe(true);
      for (const tool of t.needs) expect(text).toContain(`</${tool}>`);
      // Each tool result contains the facts the following <think> states.
      for (const c of t.toolCalls) expect(c.supported).toBe(true);
    }
  });

  it('cut content exactly into model text and tool results, split where generation stops', () => {
    for (const t of [...flawed, ...clean.slice(0, 300)]) {
      const { content, segments } = assistant(t);
      expect(segments.map((s) => s.text).join('')).toBe(content);
      expect(segments[0]?.type).toBe('text');
      segments.forEach((s, i) => {
        if (s.type === 'tool_result') {
          expect(s.text).toMatch(/^ <result>\n[\s\S]*\n<\/result>$/);
          expect(segments[i - 1]?.text).toMatch(/<\/(search|python)>$/);
          expect(segments[i + 1]?.type).toBe('text');
          expect(segments[i + 1]?.text.startsWith(' <think>')).toBe(true);
        } else {
          expect(s.text).not.toContain('<result>');
          expect(s.text).not.toContain('</result>');
        }
      });
      const results = segments.filter((s) => s.type === 'tool_result').map((s) => s.text);
      expect(results).toEqual(t.toolCalls.map((c) => ` <result>\n${c.result}\n</result>`));
    }
  });

  it('hold tool results that the tools really return (python3 agrees with the python results)', () => {
    const search = localSearch(corpus);
    const pyCalls: { code: string; result: string }[] = [];
    for (const t of [...flawed, ...clean]) {
      for (const c of t.toolCalls) {
        if (c.tool === 'search') expect(c.result).toBe(search(c.call));
        else pyCalls.push({ code: c.call, result: c.result });
      }
      // The call text in the content is exactly what was run.
      for (const c of t.toolCalls) expect(assistant(t).content).toContain(`<${c.tool}> ${c.call} </${c.tool}>`);
    }
    expect(pyCalls.length).toBeGreaterThan(500);
    expect(pythonRun(pyCalls.map((c) => c.code))).toEqual(pyCalls.map((c) => c.result));
  });

  it('label every deliberate flaw, at about the configured rates', () => {
    const counts = Object.fromEntries(FLAWS.map((f) => [f, flawed.filter((t) => t.flaws.includes(f)).length]));
    const n = flawed.length;
    const rates = { wrong_answer: 0.1, skipped_tool: 0.08, extra_search: 0.08, off_query: 0.08, bad_format: 0.03 };
    for (const f of FLAWS) {
      const p = rates[f];
      // Within 4 binomial standard deviations.
      expect(Math.abs((counts[f] as number) - n * p)).toBeLessThan(4 * Math.sqrt(n * p * (1 - p)) + 1);
    }
    for (const t of flawed) {
      const text = assistant(t).content;
      const violation = formatViolation(text);
      const boxed = boxedAnswer(text);
      const flaw = t.flaws[0];
      expect(t.flaws.length).toBeLessThanOrEqual(1);
      if (flaw === 'bad_format') {
        expect(violation).not.toBeNull();
        expect(t.wellFormed).toBe(false);
        continue;
      }
      expect(violation).toBeNull();
      expect(t.wellFormed).toBe(true);
      expect(t.correct).toBe(boxed === t.groundTruth);
      if (flaw === 'wrong_answer' || flaw === 'skipped_tool') expect(boxed).not.toBe(t.groundTruth);
      else expect(boxed).toBe(t.groundTruth);
      if (flaw === 'skipped_tool') expect(t.toolCalls).toHaveLength(0);
      const q = questions.train.find((x) => x.id === t.questionId);
      const planned = q?.solution.length ?? 0;
      if (flaw === 'extra_search') {
        expect(t.toolCalls).toHaveLength(planned + 1);
        expect(t.toolCalls[0]?.tool).toBe('search');
      }
      if (flaw === 'off_query') {
        // A slip: the first call differs from the planned one by one transposition, then (if it missed) the planned call.
        const first = t.toolCalls[0];
        expect(first?.call).not.toBe(q?.solution[0]?.call);
        expect(first?.call.length).toBe(q?.solution[0]?.call.length);
        expect(t.toolCalls.length === planned + 1 || first?.supported).toBe(true);
      }
      if (!flaw) expect(t.toolCalls).toHaveLength(planned);
    }
  });

  it('never write a held-out entity name in the model text of a training trace', () => {
    const heldOut = world.entities.filter((e) => e.split === 'valid' || e.split === 'test').map((e) => e.name);
    for (const t of flawed) {
      const generated = assistant(t).segments.filter((x) => x.type === 'text').map((x) => x.text).join(' ');
      for (const name of heldOut) if (generated.includes(name)) throw new Error(`${t.id} writes held-out ${name}: ${generated}`);
    }
  });

  it('score as the deep-research reward expects: 1 (1.1 with both tools) when right, 0 when wrong, -1 on bad format', () => {
    for (const t of [...flawed, ...clean]) {
      const r = deepResearchReward({ response: assistant(t).content, groundTruth: t.groundTruth });
      if (!t.wellFormed) expect(r.score).toBe(-1);
      else if (t.correct) expect(r.score).toBeCloseTo(t.family === 'both' || (t.flaws.includes('extra_search') && t.family === 'python') ? 1.1 : 1, 9);
      else expect(r.score).toBe(0);
    }
  });

  it('use the given runTool for every call and report tool failures by call', async () => {
    const seen: string[] = [];
    const base = localRunTool(corpus);
    const recording = async (tag: string, content: string) => {
      seen.push(`${tag}:${content}`);
      return base(tag, content);
    };
    const some = questions.train.slice(0, 40);
    const traces = await generateTraces(some, world, recording, { seed: 1 });
    expect(seen).toEqual(traces.flatMap((t) => t.toolCalls.map((c) => `${c.tool}:${c.call}`)));
    const failing = async () => {
      throw new Error('sandbox down');
    };
    const q = some.find((x) => x.family === 'python');
    await expect(generateTraces([q!], world, failing, { seed: 1, flawRates: NO_FLAWS })).rejects.toThrow(/the python tool failed on "print\(.*\)": sandbox down/);
    await expect(generateTraces(some, world, 'nope' as never, { seed: 1 })).rejects.toThrow('Expected a function (tag, content) => Promise<string> for runTool but received "nope" of type string');
    await expect(generateTraces(some, world, base, { seed: 1, flawRates: { wrong_answer: 2 } })).rejects.toThrow('Expected a number in [0, 1] for flawRates.wrong_answer but received 2 of type number');
    await expect(generateTraces(some, world, base, { seed: 1, flawRates: { typo: 0.1 } as never })).rejects.toThrow('flawRates key');
  });
});

describe('local python stand-in (test helper)', () => {
  it('agrees with python3 on integer arithmetic, precedence included', () => {
    const exprs = ['2 ** 3 ** 2', '-2 ** 2', '7 // -2', '-7 % 3', '(3 + 4) * 5 - 6 // 4', '17 % 5 * 3', '2 ** 64 + 1', '-(3 - 10) * 2', '100 // 7 // 2'];
    const rng = (() => { let s = 99; return () => (s = (s * 1103515245 + 12345) % 2147483648); })();
    for (let i = 0; i < 200; i++) {
      const n = () => String(1 + (rng() % 5000)); // never 0: no division by zero
      const ops = ['+', '-', '*', '//', '%'];
      const op = () => ops[rng() % ops.length] as string;
      exprs.push(`(${n()} ${op()} ${n()}) ${op()} ${1 + (rng() % 97)} ${op()} ${n()}`);
    }
    expect(exprs.map((e) => localPython(`print(${e})`))).toEqual(pythonEval(exprs));
    expect(localPython('print(1 // 0)')).toMatch(/^ZeroDivisionError/);
    expect(localPython('import os')).toMatch(/^NameError/);
  });
});
