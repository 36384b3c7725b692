// Demo questions with ground truths in three families: `search` (one fact from the corpus),
// `python` (exact integer arithmetic to delegate) and `both` (facts to search, then a computation).
import { ArpoError, invalidArgument } from '../../errors';
import { withArticle } from './corpus';
import { Rng } from './rng';
import { entitiesOfSplit, entityById, SPLITS, type City, type Company, type Entity, type Mountain, type Person, type Split, type World } from './world';

export type QuestionFamily = 'search' | 'python' | 'both';
export type ToolName = 'search' | 'python';

/** One step of the intended solution: the call a good policy makes and what it learns from it. */
export interface SolutionStep {
  readonly tool: ToolName;
  /** The search query or the python code, exactly as written between the tags. */
  readonly call: string;
  /** Reasoning before the call (goes into a `<think>`). */
  readonly intent: string;
  /** What the result establishes, stated plainly (goes into the next `<think>`). */
  readonly finding: string;
  /** Strings the tool result must contain for the finding to be supported by it. */
  readonly expect: readonly string[];
}

export interface DemoQuestion {
  readonly id: string;
  readonly split: Split;
  readonly family: QuestionFamily;
  readonly needs: readonly ToolName[];
  readonly question: string;
  /** The exact answer, written as the boxed answer should be (integers without separators). */
  readonly groundTruth: string;
  /** Template name, e.g. `city.founded`, `python.mul`, `both.founder_age`. */
  readonly template: string;
  /** Entity ids the question is about or whose facts the answer needs (all in `split`). */
  readonly entities: readonly string[];
  /** For python and both: the arithmetic in python syntax (its value is the ground truth). */
  readonly expression: string | null;
  readonly solution: readonly SolutionStep[];
}

export interface QuestionSizes {
  readonly train: number;
  readonly valid: number;
  readonly test: number;
  /** Share of each family in every split (must sum to 1). */
  readonly familyMix: Readonly<Record<QuestionFamily, number>>;
}

export const DEFAULT_QUESTION_SIZES: QuestionSizes = Object.freeze({
  train: 800,
  valid: 100,
  test: 200,
  familyMix: Object.freeze({ search: 0.4, python: 0.25, both: 0.35 }),
});

const NEEDS: Record<QuestionFamily, readonly ToolName[]> = { search: ['search'], python: ['python'], both: ['search', 'python'] };

type Draft = Omit<DemoQuestion, 'id' | 'split' | 'family' | 'needs'>;

function searchStep(query: string, intent: string, finding: string, expect: string[]): SolutionStep {
  return { tool: 'search', call: query, intent, finding, expect };
}

function pythonStep(expression: string, intent: string, value: string): SolutionStep {
  return { tool: 'python', call: `print(${expression})`, intent, finding: `The result is ${value}.`, expect: [value] };
}

function single(template: string, e: Entity, question: string, answer: string | number, step: SolutionStep): Draft {
  return { template, question, groundTruth: String(answer), entities: [e.id], expression: null, solution: [step] };
}

// ---- family `search`: one fact per question ---------------------------------------------------

function searchDrafts(e: Entity, w: World, rng: Rng): Draft[] {
  switch (e.kind) {
    case 'city':
      return cityQuestions(e, rng);
    case 'person':
      return personQuestions(e, w, rng);
    case 'company':
      return companyQuestions(e, w, rng);
    case 'mountain':
      return mountainQuestions(e, rng);
  }
}

function cityQuestions(c: City, rng: Rng): Draft[] {
  return [
    single('city.founded', c, rng.pick([`In which year was ${c.name} founded?`, `When was the city of ${c.name} founded?`]), c.foundedYear,
      searchStep(`${c.name} founded`, `I need the year ${c.name} was founded. I will search for it.`, `${c.name} was founded in ${c.foundedYear}.`, [c.name, String(c.foundedYear)])),
    single('city.population', c, rng.pick([`What is the population of ${c.name}?`, `How many people live in ${c.name}?`]), c.population,
      searchStep(`${c.name} population`, `I need the population of ${c.name}. I will search for it.`, `The population of ${c.name} is ${c.population}.`, [c.name, String(c.population)])),
    single('city.country', c, `In which country is the city of ${c.name}?`, c.country,
      searchStep(`${c.name} country`, `I need the country of ${c.name}. I will search for it.`, `${c.name} is in ${c.country}.`, [c.name, c.country])),
  ];
}

function personQuestions(p: Person, w: World, rng: Rng): Draft[] {
  const city = entityById(w, p.birthCity).name;
  return [
    single('person.birth_year', p, rng.pick([`In which year was ${p.name} born?`, `When was ${p.name} born?`]), p.birthYear,
      searchStep(`${p.name} born`, `I need the birth year of ${p.name}. I will search for it.`, `${p.name} was born in ${p.birthYear}.`, [p.name, String(p.birthYear)])),
    { ...single('person.birth_city', p, `In which city was ${p.name} born?`, city,
      searchStep(`${p.name} born`, `I need the city where ${p.name} was born. I will search for it.`, `${p.name} was born in ${city}.`, [p.name, city])), entities: [p.id, p.birthCity] },
    single('person.occupation', p, rng.pick([`What was the occupation of ${p.name}?`, `What did ${p.name} work as?`]), p.occupation,
      searchStep(`${p.name} occupation`, `I need the occupation of ${p.name}. I will search for it.`, `${p.name} was ${withArticle(p.occupation)}.`, [p.name, p.occupation])),
  ];
}

function companyQuestions(c: Company, w: World, rng: Rng): Draft[] {
  const founder = entityById(w, c.founder).name;
  const hq = entityById(w, c.headquarters).name;
  const founded = `${c.name} was founded in ${c.foundedYear} by ${founder}.`;
  return [
    single('company.founded', c, `In which year was ${c.name} founded?`, c.foundedYear,
      searchStep(`${c.name} founded`, `I need the year ${c.name} was founded. I will search for it.`, founded, [c.name, String(c.foundedYear)])),
    { ...single('company.founder', c, rng.pick([`Who founded ${c.name}?`, `Who was the founder of ${c.name}?`]), founder,
      searchStep(`${c.name} founded`, `I need the founder of ${c.name}. I will search for it.`, founded, [c.name, founder])), entities: [c.id, c.founder] },
    { ...single('company.headquarters', c, `In which city does ${c.name} have its headquarters?`, hq,
      searchStep(`${c.name} headquarters`, `I need the headquarters of ${c.name}. I will search for it.`, `${c.name} has its headquarters in ${hq}.`, [c.name, hq])), entities: [c.id, c.headquarters] },
    single('company.employees', c, rng.pick([`How many employees does ${c.name} have?`, `How many people work for ${c.name}?`]), c.employees,
      searchStep(`${c.name} employees`, `I need the number of employees of ${c.name}. I will search for it.`, `${c.name} has ${c.employees} employees.`, [c.name, String(c.employees)])),
    single('company.product', c, `What does ${c.name} make?`, c.product,
      searchStep(`${c.name} makes`, `I need what ${c.name} makes. I will search for it.`, `${c.name} makes ${c.product}.`, [c.name, c.product])),
  ];
}

function mountainQuestions(m: Mountain, rng: Rng): Draft[] {
  return [
    single('mountain.height', m, rng.pick([`How high is ${m.name} in metres?`, `What is the height of ${m.name} in metres?`]), m.heightM,
      searchStep(`${m.name} height`, `I need the height of ${m.name}. I will search for it.`, `${m.name} is ${m.heightM} metres high.`, [m.name, String(m.heightM)])),
    single('mountain.first_ascent', m, `In which year was the first ascent of ${m.name}?`, m.firstAscentYear,
      searchStep(`${m.name} first ascent`, `I need the year of the first ascent of ${m.name}. I will search for it.`, `The first ascent of ${m.name} was in ${m.firstAscentYear}.`, [m.name, String(m.firstAscentYear)])),
    single('mountain.country', m, `In which country is ${m.name}?`, m.country,
      searchStep(`${m.name} country`, `I need the country of ${m.name}. I will search for it.`, `${m.name} is in ${m.country}.`, [m.name, m.country])),
  ];
}

// ---- family `both`: search facts, then compute ------------------------------------------------

/** A two-fact question: search both facts, then python computes `x op y`. */
function twoFactDraft(
  template: string, question: string, a: Entity, b: Entity,
  steps: [SolutionStep, SolutionStep], x: number, y: number, op: '-' | '+', what: string,
): Draft {
  const expression = `${x} ${op} ${y}`;
  const value = String(op === '-' ? x - y : x + y);
  return {
    template, question, groundTruth: value, entities: [a.id, b.id], expression,
    solution: [...steps, pythonStep(expression, `Now I compute ${what} with python.`, value)],
  };
}

function bothDrafts(split: Split, w: World, rng: Rng): Draft[] {
  const ents = entitiesOfSplit(w, split);
  const cities = ents.filter((e): e is City => e.kind === 'city');
  const people = ents.filter((e): e is Person => e.kind === 'person');
  const companies = ents.filter((e): e is Company => e.kind === 'company');
  const mountains = ents.filter((e): e is Mountain => e.kind === 'mountain');
  const out: Draft[] = [];
  const foundedStep = (c: City) =>
    searchStep(`${c.name} founded`, `I need the year ${c.name} was founded.`, `${c.name} was founded in ${c.foundedYear}.`, [c.name, String(c.foundedYear)]);
  const populationStep = (c: City) =>
    searchStep(`${c.name} population`, `I need the population of ${c.name}.`, `The population of ${c.name} is ${c.population}.`, [c.name, String(c.population)]);
  const heightStep = (m: Mountain) =>
    searchStep(`${m.name} height`, `I need the height of ${m.name}.`, `${m.name} is ${m.heightM} metres high.`, [m.name, String(m.heightM)]);
  const bornStep = (p: Person) =>
    searchStep(`${p.name} born`, `I need the birth year of ${p.name}.`, `${p.name} was born in ${p.birthYear}.`, [p.name, String(p.birthYear)]);

  for (const a of cities) {
    for (const b of cities) {
      if (a.id >= b.id) continue;
      const [x, y] = rng.chance(0.5) ? [a, b] : [b, a];
      if (x.foundedYear !== y.foundedYear) {
        const [late, early] = x.foundedYear > y.foundedYear ? [x, y] : [y, x];
        out.push(twoFactDraft('both.city_founding_gap', `How many years passed between the founding of ${x.name} and the founding of ${y.name}?`,
          x, y, [foundedStep(x), foundedStep(y)], late.foundedYear, early.foundedYear, '-', 'the difference of the two years'));
      }
      out.push(twoFactDraft('both.city_population_sum', `What is the combined population of ${x.name} and ${y.name}?`,
        x, y, [populationStep(x), populationStep(y)], x.population, y.population, '+', 'the sum of the two populations'));
    }
  }
  for (const a of mountains) {
    for (const b of mountains) {
      if (a.heightM <= b.heightM) continue;
      out.push(twoFactDraft('both.mountain_height_gap', `How many metres higher is ${a.name} than ${b.name}?`,
        a, b, [heightStep(a), heightStep(b)], a.heightM, b.heightM, '-', 'the difference of the two heights'));
    }
  }
  for (const a of people) {
    for (const b of people) {
      if (a.birthYear >= b.birthYear) continue;
      out.push(twoFactDraft('both.person_age_gap', `How many years older is ${a.name} than ${b.name}?`,
        a, b, [bornStep(a), bornStep(b)], b.birthYear, a.birthYear, '-', 'the difference of the two birth years'));
    }
  }
  for (const c of companies) {
    const f = entityById(w, c.founder) as Person;
    const expression = `${c.foundedYear} - ${f.birthYear}`;
    const value = String(c.foundedYear - f.birthYear);
    out.push({
      template: 'both.founder_age', question: `How old was the founder of ${c.name} when the company was founded?`,
      groundTruth: value, entities: [c.id, f.id], expression,
      solution: [
        searchStep(`${c.name} founded`, `I need the founder of ${c.name} and the year it was founded.`, `${c.name} was founded in ${c.foundedYear} by ${f.name}.`, [c.name, f.name, String(c.foundedYear)]),
        bornStep(f),
        pythonStep(expression, 'Now I compute the age of the founder with python.', value),
      ],
    });
  }
  return out;
}

// ---- family `python`: arithmetic a tiny model cannot do in its head ----------------------------

/** One arithmetic question; `expression` is python and exact in JS for these ranges (< 2^53). */
function pythonDraft(rng: Rng): Draft {
  let question: string;
  let expression: string;
  let value: number;
  let template: string;
  const r = (lo: number, hi: number) => rng.int(lo, hi);
  switch (rng.int(0, 5)) {
    case 0: {
      const a = r(120, 9999), b = r(11, 999);
      [template, expression, value] = ['python.mul', `${a} * ${b}`, a * b];
      question = `What is ${a} * ${b}?`;
      break;
    }
    case 1: {
      const a = r(100, 999), b = r(11, 99), c = r(100, 9999);
      [template, expression, value] = ['python.mul_add', `${a} * ${b} + ${c}`, a * b + c];
      question = `What is ${a} * ${b} + ${c}?`;
      break;
    }
    case 2: {
      const a = r(1000, 99999), b = r(1000, 99999), c = r(1000, 99999), d = r(1000, 99999);
      [template, expression, value] = ['python.sum4', `${a} + ${b} + ${c} + ${d}`, a + b + c + d];
      question = `What is ${a} + ${b} + ${c} + ${d}?`;
      break;
    }
    case 3: {
      const b = r(100, 5000), a = b + r(1, 9000), c = r(11, 99);
      [template, expression, value] = ['python.sub_mul', `(${a} - ${b}) * ${c}`, (a - b) * c];
      question = `What is (${a} - ${b}) * ${c}?`;
      break;
    }
    case 4: {
      const a = r(3, 29), b = r(3, 6);
      [template, expression, value] = ['python.power', `${a} ** ${b}`, a ** b];
      question = `What is ${a} to the power of ${b}?`;
      break;
    }
    default: {
      const a = r(10000, 999999), b = r(7, 97);
      [template, expression, value] = ['python.remainder', `${a} % ${b}`, a % b];
      question = `What is the remainder when ${a} is divided by ${b}?`;
      break;
    }
  }
  const answer = String(value);
  return {
    template, question, groundTruth: answer, entities: [], expression,
    solution: [pythonStep(expression, 'This is arithmetic, so I will compute it with python.', answer)],
  };
}

// ---- splits -----------------------------------------------------------------------------------

/**
 * Pair templates have very different pool sizes (pairs of people outnumber
 * companies by far), so draws go round-robin over templates, each shuffled:
 * the first n of the result use every template about equally.
 */
function interleaveTemplates(drafts: readonly Draft[], rng: Rng): Draft[] {
  const byTemplate = new Map<string, Draft[]>();
  for (const d of drafts) {
    const list = byTemplate.get(d.template) ?? [];
    list.push(d);
    byTemplate.set(d.template, list);
  }
  const queues = [...byTemplate.keys()].sort().map((k) => rng.shuffled(byTemplate.get(k) as Draft[]));
  const out: Draft[] = [];
  for (let round = 0; out.length < drafts.length; round++) {
    for (const q of queues) if (round < q.length) out.push(q[round] as Draft);
  }
  return out;
}

function checkQuestionSizes(sizes: QuestionSizes): void {
  for (const s of SPLITS) {
    const n = sizes[s];
    if (typeof n !== 'number' || !Number.isInteger(n) || n < 1 || n > 100000) throw invalidArgument('an integer in [1, 100000]', `sizes.questions.${s}`, n);
  }
  const mix = sizes.familyMix;
  const fams: QuestionFamily[] = ['search', 'python', 'both'];
  const total = fams.reduce((a, f) => a + (typeof mix?.[f] === 'number' && mix[f] >= 0 ? mix[f] : NaN), 0);
  if (!(Math.abs(total - 1) < 1e-9)) throw invalidArgument('non-negative search/python/both shares summing to 1', 'sizes.questions.familyMix', mix);
}

/** Family counts for n questions: largest-remainder rounding of the mix. */
function familyCounts(n: number, mix: Readonly<Record<QuestionFamily, number>>): Record<QuestionFamily, number> {
  const fams: QuestionFamily[] = ['search', 'python', 'both'];
  const raw = fams.map((f) => n * mix[f]);
  const counts = raw.map(Math.floor);
  let left = n - counts.reduce((a, b) => a + b, 0);
  const order = fams.map((_, i) => i).sort((i, j) => (raw[j] as number) - (counts[j] as number) - ((raw[i] as number) - (counts[i] as number)) || i - j);
  for (const i of order) if (left-- > 0) counts[i] = (counts[i] as number) + 1;
  return { search: counts[0] as number, python: counts[1] as number, both: counts[2] as number };
}

/**
 * Generates the question splits. Entity questions (search, both) of a split
 * only involve that split's entities, so held-out questions are about
 * entities never asked about in training (disjoint entities); python
 * questions are distinct expressions across all splits (disjoint instances).
 */
export function generateQuestions(world: World, sizes: QuestionSizes = DEFAULT_QUESTION_SIZES): Record<Split, DemoQuestion[]> {
  checkQuestionSizes(sizes);
  const out = { train: [], valid: [], test: [] } as Record<Split, DemoQuestion[]>;
  const seenExpressions = new Set<string>();
  const pyRng = Rng.forStream(world.seed, 'questions.python');
  for (const split of SPLITS) {
    const rng = Rng.forStream(world.seed, `questions.${split}`);
    const counts = familyCounts(sizes[split], sizes.familyMix);
    const searchPool = rng.shuffled(entitiesOfSplit(world, split).flatMap((e) => searchDrafts(e, world, rng)));
    const bothPool = interleaveTemplates(bothDrafts(split, world, rng), rng);
    for (const [family, pool] of [['search', searchPool], ['both', bothPool]] as const) {
      if (pool.length < counts[family]) {
        throw new ArpoError('BAD_CONFIG', `demo ${split} split: asked for ${counts[family]} ${family} questions but its entities support only ${pool.length}; enlarge sizes.world or lower sizes.questions.${split}`);
      }
    }
    const drafts: [QuestionFamily, Draft][] = [
      ...searchPool.slice(0, counts.search).map((d) => ['search', d] as [QuestionFamily, Draft]),
      ...bothPool.slice(0, counts.both).map((d) => ['both', d] as [QuestionFamily, Draft]),
    ];
    for (let i = 0; i < counts.python; i++) {
      let d = pythonDraft(pyRng);
      for (let tries = 0; seenExpressions.has(d.expression ?? '') && tries < 1000; tries++) d = pythonDraft(pyRng);
      seenExpressions.add(d.expression ?? '');
      drafts.push(['python', d]);
    }
    out[split] = rng.shuffled(drafts).map(([family, d], i) => ({
      id: `${split}-${String(i).padStart(5, '0')}`, split, family, needs: NEEDS[family], ...d,
    }));
  }
  return out;
}
