// SFT traces for the demo: full conversations in the exact protocol text the policy must produce,
// tool results filled in by actually running the tools, with a labelled share of deliberate flaws.
//
// Output format (one JSON object per line of sft.jsonl):
//   { id, questionId, family, needs, template, groundTruth, finalAnswer, correct, wellFormed, grounded,
//     flaws: Flaw[], toolCalls: [{ tool, call, result, supported }],
//     messages: [ { role: 'system', content }, { role: 'user', content },
//                 { role: 'assistant', content, segments: [{ type: 'text' | 'tool_result', text }] } ] }
// - assistant `content` is the flat text; `segments` cut it exactly (their concatenation equals
//   content). `text` segments are what the policy generates (the loss applies to them); a
//   `tool_result` segment is ` <result>\n<tool output>\n</result>`, appended by the environment
//   (mask it out of the loss, as ARPO.md says). Tokenise segment by segment and concatenate,
//   which is how a rollout builds the same sequence (tool results are tokenised on their own).
// - A text segment before a tool result ends with the closing tag (`</search>`, `</python>`),
//   where generation stops; the next text segment starts with ` <think>`.
// - flaws (at most one per trace): wrong_answer (the final answer is wrong, format fine),
//   skipped_tool (no tool call where one was needed: a guess), extra_search (a useless
//   search first, answer right), off_query (a first call with a typo, then the right one),
//   bad_format (answer without \boxed{}: fails the deep-research format check).
// - correct: the boxed answer equals groundTruth; wellFormed: passes the deep-research format rules;
//   grounded: every call the trace relies on returned the facts its next <think> states.
import { ArpoError, invalidArgument } from '../../errors';
import type { DemoQuestion, SolutionStep, ToolName } from './questions';
import type { RunTool } from './local-tools';
import { DEMO_SYSTEM_PROMPT } from './prompt';
import { Rng } from './rng';
import { COMPANY_SUFFIXES, OCCUPATIONS, PRODUCTS, type Split, type World } from './world';

export type Flaw = 'wrong_answer' | 'skipped_tool' | 'extra_search' | 'off_query' | 'bad_format';
export const FLAWS: readonly Flaw[] = ['wrong_answer', 'skipped_tool', 'extra_search', 'off_query', 'bad_format'];

export interface TraceSegment {
  readonly type: 'text' | 'tool_result';
  readonly text: string;
}

export interface TraceToolCall {
  readonly tool: ToolName;
  readonly call: string;
  readonly result: string;
  /** The result states what the solution step expects: search, every expected phrase as whole words; python, exactly the value. */
  readonly supported: boolean;
}

export interface SftTrace {
  readonly id: string;
  readonly questionId: string;
  readonly family: DemoQuestion['family'];
  readonly needs: readonly ToolName[];
  readonly template: string;
  readonly groundTruth: string;
  readonly finalAnswer: string | null;
  readonly correct: boolean;
  readonly wellFormed: boolean;
  readonly grounded: boolean;
  readonly flaws: readonly Flaw[];
  readonly toolCalls: readonly TraceToolCall[];
  readonly messages: readonly [
    { readonly role: 'system'; readonly content: string },
    { readonly role: 'user'; readonly content: string },
    { readonly role: 'assistant'; readonly content: string; readonly segments: readonly TraceSegment[] },
  ];
}

export interface TraceOptions {
  readonly seed: number;
  /** Probability of each flaw per trace (drawn as one categorical; the rest is clean). Sum <= 1. */
  readonly flawRates?: Readonly<Partial<Record<Flaw, number>>>;
  readonly systemPrompt?: string;
}

export const DEFAULT_FLAW_RATES: Readonly<Record<Flaw, number>> = Object.freeze({
  wrong_answer: 0.1,
  skipped_tool: 0.08,
  extra_search: 0.08,
  off_query: 0.08,
  bad_format: 0.03,
});

/** Accumulates the assistant turn as text / tool_result segments. */
class TraceWriter {
  readonly segments: TraceSegment[] = [];
  readonly calls: TraceToolCall[] = [];

  text(s: string): void {
    const last = this.segments[this.segments.length - 1];
    if (last && last.type === 'text') this.segments[this.segments.length - 1] = { type: 'text', text: last.text + s };
    else this.segments.push({ type: 'text', text: s });
  }

  /** Writes the call, runs the tool, appends ` <result>\n...\n</result>` (the protocol of ARPO.md). */
  async call(runTool: RunTool, tool: ToolName, call: string, expect: readonly string[]): Promise<TraceToolCall> {
    this.text(` <${tool}> ${call} </${tool}>`);
    let result: string;
    try {
      result = await runTool(tool, call);
    } catch (e) {
      throw new ArpoError('TOOL_FAILED', `demo traces: the ${tool} tool failed on ${JSON.stringify(call)}: ${e instanceof Error ? e.message : String(e)}`, { cause: e });
    }
    if (typeof result !== 'string') throw invalidArgument('a string tool result', `runTool(${JSON.stringify(tool)}) result`, result);
    this.segments.push({ type: 'tool_result', text: ` <result>\n${result}\n</result>` });
    const supported = tool === 'python' && expect.length > 0 ? result.trim() === expect.join('\n') : expect.every((x) => containsPhrase(result, x));
    const record = { tool, call, result, supported };
    this.calls.push(record);
    return record;
  }
}

/** `phrase` occurs in `text` as whole words (so year 1843 is not found inside 218435). */
function containsPhrase(text: string, phrase: string): boolean {
  for (let i = text.indexOf(phrase); i >= 0; i = text.indexOf(phrase, i + 1)) {
    const before = text[i - 1];
    const after = text[i + phrase.length];
    if ((before === undefined || !/[A-Za-z0-9]/.test(before)) && (after === undefined || !/[A-Za-z0-9]/.test(after))) return true;
  }
  return false;
}

/**
 * A different value of the same sort: another digit for numbers, another name of the same list for
 * words (names from the question's split only, so no held-out name enters a training trace).
 */
function wrongValue(truth: string, split: Split, world: World, rng: Rng): string {
  if (/^\d+$/.test(truth)) {
    for (;;) {
      const digits = truth.split('');
      const i = rng.int(0, digits.length - 1);
      digits[i] = String(rng.int(i === 0 && digits.length > 1 ? 1 : 0, 9));
      const alt = digits.join('');
      if (alt !== truth) return alt;
    }
  }
  const namesOf = (kind: string) => world.entities.filter((e) => e.kind === kind && e.split === split).map((e) => e.name);
  const pools = [world.countries, OCCUPATIONS, PRODUCTS, namesOf('city'), namesOf('person'), namesOf('company'), namesOf('mountain')];
  const pool = (pools.find((p) => p.includes(truth)) ?? pools[0] ?? []).filter((x) => x !== truth);
  return pool.length > 0 ? rng.pick(pool) : `${truth} ${rng.pick(COMPANY_SUFFIXES)}`;
}

/** A guess "from memory": numbers keep their leading digits and round the rest, words are another value. */
function guessedValue(truth: string, split: Split, world: World, rng: Rng): string {
  if (/^\d+$/.test(truth) && truth.length >= 3) {
    const keep = rng.int(1, 2);
    const guess = truth.slice(0, keep) + '0'.repeat(truth.length - keep);
    return guess === truth ? wrongValue(truth, split, world, rng) : guess;
  }
  return wrongValue(truth, split, world, rng);
}

/** The query or code with a small slip: two letters of the entity name swapped, or two digits swapped. */
function offCall(step: SolutionStep, rng: Rng): string {
  const call = step.call;
  const re = step.tool === 'search' ? /[a-z]{2}/g : /\d{2}/g;
  // For a search, slip inside the entity name (the first expected phrase) when the query holds it.
  const name = step.tool === 'search' ? (step.expect[0] ?? '') : '';
  const from = name && call.includes(name) ? call.indexOf(name) : 0;
  const to = name && call.includes(name) ? from + name.length : call.length;
  const spots: number[] = [];
  for (let m = re.exec(call); m; m = re.exec(call)) {
    if (m[0][0] !== m[0][1] && m.index >= from && m.index + 2 <= to) spots.push(m.index);
    re.lastIndex = m.index + 1;
  }
  if (spots.length === 0) return `${call} ${call}`;
  const i = rng.pick(spots);
  return call.slice(0, i) + call[i + 1] + call[i] + call.slice(i + 2);
}

function drawFlaw(rng: Rng, rates: Readonly<Record<Flaw, number>>): Flaw | null {
  const u = rng.next();
  let acc = 0;
  for (const f of FLAWS) {
    acc += rates[f];
    if (u < acc) return f;
  }
  return null;
}

function checkRates(rates: Readonly<Partial<Record<Flaw, number>>> | undefined): Record<Flaw, number> {
  const out = { ...DEFAULT_FLAW_RATES };
  for (const [k, v] of Object.entries(rates ?? {})) {
    if (!FLAWS.includes(k as Flaw)) throw invalidArgument(`one of ${FLAWS.join(', ')}`, 'flawRates key', k);
    if (typeof v !== 'number' || !(v >= 0 && v <= 1)) throw invalidArgument('a number in [0, 1]', `flawRates.${k}`, v);
    out[k as Flaw] = v;
  }
  const total = FLAWS.reduce((a, f) => a + out[f], 0);
  if (total > 1 + 1e-9) throw invalidArgument('flaw rates summing to at most 1', 'flawRates', out);
  return out;
}

/**
 * Writes the assistant turn for one question: `<think> intent </think>`, then per solution
 * step the call and its result, each followed by `<think> finding [next intent] </think>`.
 * `flaw` decides the deliberate imperfection. Returns the answer to box.
 */
async function writeTrace(w: TraceWriter, q: DemoQuestion, flaw: Flaw | null, world: World, runTool: RunTool, rng: Rng): Promise<string> {
  const steps = q.solution;
  const first = steps[0];
  if (!first) throw new ArpoError('BAD_DATA', `demo question ${q.id} has no solution steps`);
  if (flaw === 'skipped_tool') {
    const guess = guessedValue(q.groundTruth, q.split, world, rng);
    w.text(`<think> I think I already know this without using a tool. The answer is ${guess}. </think>`);
    return guess;
  }
  if (flaw === 'extra_search') {
    const other = rng.pick(world.entities.filter((e) => e.split === q.split && !q.entities.includes(e.id)));
    w.text(`<think> I will first look up ${other.name}. </think>`);
    await w.call(runTool, 'search', other.name, []);
    w.text(` <think> That is not what the question asks about. ${first.intent} </think>`);
  } else {
    w.text(`<think> ${first.intent} </think>`);
  }
  for (let k = 0; k < steps.length; k++) {
    const step = steps[k] as SolutionStep;
    let done = false;
    if (k === 0 && flaw === 'off_query') {
      const slip = await w.call(runTool, step.tool, offCall(step, rng), step.expect);
      // A slip that still found the facts needs no retry; one that missed is retried as written.
      done = slip.supported;
      if (!done) {
        w.text(step.tool === 'search'
          ? ' <think> The result does not give what I need. I will search again. </think>'
          : ' <think> I made a typo in the code. I will run it again. </think>');
      }
    }
    if (!done) await w.call(runTool, step.tool, step.call, step.expect);
    const next = steps[k + 1];
    if (next) w.text(` <think> ${step.finding} ${next.intent} </think>`);
  }
  // The last finding, then the answer; a wrong answer misreads the value in it.
  const last = steps[steps.length - 1] as SolutionStep;
  if (flaw !== 'wrong_answer') {
    w.text(` <think> ${last.finding} </think>`);
    return q.groundTruth;
  }
  const wrong = wrongValue(q.groundTruth, q.split, world, rng);
  const misread = last.finding.includes(q.groundTruth) ? last.finding.split(q.groundTruth).join(wrong) : `${last.finding} So the answer is ${wrong}.`;
  w.text(` <think> ${misread} </think>`);
  return wrong;
}

/** The deep-research format rules (ARPO.md §3), used to label traces; tests check traces with their own copy. */
function followsFormat(text: string): boolean {
  const count = (s: string) => text.split(s).length - 1;
  if (count('<think>') === 0 || count('<think>') !== count('</think>')) return false;
  if (count('<answer>') !== 1 || count('</answer>') !== 1) return false;
  for (const tool of ['search', 'python']) {
    let pos = 0;
    for (;;) {
      const open = text.indexOf(`<${tool}>`, pos);
      if (open < 0) break;
      const close = text.indexOf(`</${tool}>`, open);
      const res = text.indexOf('<result>', open);
      const resEnd = text.indexOf('</result>', res);
      if (close < 0 || res < 0 || resEnd < 0 || !(close < res)) return false;
      pos = resEnd;
    }
  }
  const body = text.slice(text.indexOf('<answer>'), text.indexOf('</answer>'));
  return text.indexOf('<answer>') < text.indexOf('</answer>') && body.includes('\\boxed{') && body.includes('}');
}

/**
 * Generates one SFT trace per question, in order, running every tool call
 * through `runTool` (the real tools in the demo; `localRunTool` in unit tests).
 * Calls run one after another so results never depend on timing.
 */
export async function generateTraces(questions: readonly DemoQuestion[], world: World, runTool: RunTool, options: TraceOptions): Promise<SftTrace[]> {
  if (typeof runTool !== 'function') throw invalidArgument('a function (tag, content) => Promise<string>', 'runTool', runTool);
  const rates = checkRates(options.flawRates);
  const rng = Rng.forStream(options.seed, 'traces');
  const system = options.systemPrompt ?? DEMO_SYSTEM_PROMPT;
  const out: SftTrace[] = [];
  for (const q of questions) {
    const flaw = drawFlaw(rng, rates);
    const w = new TraceWriter();
    const answer = await writeTrace(w, q, flaw, world, runTool, rng);
    const boxed = flaw === 'bad_format' ? answer : `\\boxed{${answer}}`;
    w.text(` <answer> ${boxed} </answer>`);
    const content = w.segments.map((s) => s.text).join('');
    const reliedOn = flaw === 'off_query' ? w.calls.slice(1) : flaw === 'extra_search' ? w.calls.slice(1) : w.calls;
    out.push({
      id: `sft-${q.id}`, questionId: q.id, family: q.family, needs: q.needs, template: q.template, groundTruth: q.groundTruth,
      finalAnswer: flaw === 'bad_format' ? null : answer,
      correct: flaw !== 'bad_format' && answer === q.groundTruth,
      wellFormed: followsFormat(content),
      grounded: reliedOn.every((c) => c.supported) || flaw === 'skipped_tool',
      flaws: flaw ? [flaw] : [],
      toolCalls: w.calls,
      messages: [
        { role: 'system', content: system },
        { role: 'user', content: q.question },
        { role: 'assistant', content, segments: w.segments },
      ],
    });
  }
  return out;
}

/** sft.jsonl text. */
export function tracesJsonl(traces: readonly SftTrace[]): string {
  return traces.map((t) => JSON.stringify(t)).join('\n') + '\n';
}
