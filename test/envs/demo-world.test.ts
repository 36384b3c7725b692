// Demo world, corpus and questions: determinism, every answer derivable from the corpus text,
// python answers checked by Debian's python3, splits disjoint as documented.
import { generateCorpus, type CorpusDocInfo } from '../../lib/envs/demo/corpus';
import { generateQuestions, type DemoQuestion } from '../../lib/envs/demo/questions';
import { entityById, generateWorld, SPLITS, DEFAULT_WORLD_SIZES, type World } from '../../lib/envs/demo/world';
import { ArpoError } from '../../lib/errors';
import { pythonEval } from './helpers';

const SEED = 11;
const world = generateWorld(SEED);
const corpus = generateCorpus(world);
const questions = generateQuestions(world);
const all: DemoQuestion[] = SPLITS.flatMap((s) => questions[s]);

/** Sentences of the corpus (documents split at `. ` boundaries), with the doc they come from. */
const sentences: { doc: CorpusDocInfo; s: string }[] = corpus.flatMap((doc) =>
  doc.text.split(/(?<=\.)\s+/).map((s) => ({ doc, s })),
);

function escapeRe(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}
const mentions = (s: string, phrase: string) => new RegExp(`(^|[^A-Za-z0-9])${escapeRe(phrase)}([^A-Za-z0-9]|$)`).test(s);

/** The keyword every corpus statement of a fact uses (what the question's fact is about). */
const KEYWORD: Record<string, string> = {
  'city.founded': 'founded', 'city.population': 'population', 'city.country': 'country',
  'person.birth_year': 'born', 'person.birth_city': 'born', 'person.occupation': 'occupation',
  'company.founded': 'founded', 'company.founder': 'founded', 'company.headquarters': 'headquarters',
  'company.employees': 'employees', 'company.product': 'makes',
  'mountain.height': 'height', 'mountain.first_ascent': 'first ascent', 'mountain.country': 'country',
};

/** Corpus sentences stating `keyword` about `name` (the name as a whole phrase, not a longer name). */
function statements(name: string, keyword: string): string[] {
  return sentences.filter(({ s }) => mentions(s, name) && s.toLowerCase().includes(keyword)).map(({ s }) => s);
}

describe('demo world', () => {
  it('is a pure function of the seed', () => {
    expect(generateWorld(SEED)).toEqual(world);
    expect(generateCorpus(generateWorld(SEED))).toEqual(corpus);
    expect(generateQuestions(generateWorld(SEED))).toEqual(questions);
    const other = generateWorld(SEED + 1);
    const names = new Set(world.entities.map((e) => e.name));
    const overlap = other.entities.filter((e) => names.has(e.name)).length;
    expect(overlap).toBeLessThan(5); // a different seed is a different world
  });

  it('has the requested sizes, unique names and consistent facts', () => {
    const real = world.entities.filter((e) => e.split !== null);
    expect(real.filter((e) => e.kind === 'city')).toHaveLength(DEFAULT_WORLD_SIZES.cities);
    expect(real.filter((e) => e.kind === 'person')).toHaveLength(DEFAULT_WORLD_SIZES.people);
    expect(real.filter((e) => e.kind === 'company')).toHaveLength(DEFAULT_WORLD_SIZES.companies);
    expect(real.filter((e) => e.kind === 'mountain')).toHaveLength(DEFAULT_WORLD_SIZES.mountains);
    const lower = world.entities.map((e) => e.name.toLowerCase());
    expect(new Set(lower).size).toBe(lower.length);
    // No invented word is an English article (SQuAD normalisation would delete it from answers).
    for (const w of Object.keys(world.lexicon)) expect(['a', 'an', 'the']).not.toContain(w.toLowerCase());
    for (const e of real) {
      if (e.kind === 'company') {
        const f = entityById(world, e.founder);
        expect(f.split).toBe(e.split);
        expect(entityById(world, e.headquarters).split).toBe(e.split);
        if (f.kind !== 'person') throw new Error('founder is not a person');
        expect(e.foundedYear - f.birthYear).toBeGreaterThanOrEqual(22);
      }
      if (e.kind === 'person') expect(entityById(world, e.birthCity).split).toBe(e.split);
    }
    // Decoys imitate a real name and are never asked about.
    const decoys = world.entities.filter((e) => e.split === null);
    expect(decoys.length).toBeGreaterThan(20);
    for (const d of decoys) expect(entityById(world, d.decoyOf as string).kind).toBe(d.kind);
  });

  it('rejects bad seeds and sizes with the standard message', () => {
    expect(() => generateWorld(-1)).toThrow('Expected an integer in [0, 2^32) for seed but received -1 of type number');
    expect(() => generateWorld(1.5)).toThrow(ArpoError);
    expect(() => generateWorld(1, { ...DEFAULT_WORLD_SIZES, cities: 2 })).toThrow('Expected an integer in [6, 5000] for sizes.world.cities but received 2 of type number');
    expect(() => generateWorld(1, { ...DEFAULT_WORLD_SIZES, splitFractions: { train: 0.5, valid: 0.1, test: 0.1 } })).toThrow('sizes.world.splitFractions');
  });
});

describe('demo corpus', () => {
  it('has unique ids and the {id, title, text} shape', () => {
    expect(new Set(corpus.map((d) => d.id)).size).toBe(corpus.length);
    for (const d of corpus) {
      expect(d.title.length).toBeGreaterThan(0);
      expect(d.text.length).toBeGreaterThan(20);
      // Tags in documents would corrupt the tool protocol.
      expect(d.text).not.toMatch(/[<>{}]/);
    }
    expect(corpus.filter((d) => d.role === 'decoy').length).toBeGreaterThan(20);
    expect(corpus.filter((d) => d.role === 'namesake').length).toBeGreaterThan(20);
  });
});

describe('demo questions', () => {
  it('states every search answer in the corpus, once and without contradiction', () => {
    const search = all.filter((q) => q.family === 'search');
    expect(search.length).toBeGreaterThan(300);
    for (const q of search) {
      const name = entityById(world, q.entities[0] as string).name;
      expect(q.question).toContain(name);
      const said = statements(name, KEYWORD[q.template] as string);
      // At least one sentence states it, and every sentence stating that fact about that name agrees.
      if (said.length === 0) throw new Error(`${q.id} ${q.question} -> ${q.groundTruth}: no statement in the corpus`);
      for (const s of said) {
        if (!mentions(s, q.groundTruth)) throw new Error(`${q.id} ${q.question} -> ${q.groundTruth}: contradicted by ${JSON.stringify(s)}`);
      }
    }
  });

  it('computes every python and both answer exactly (checked by python3)', () => {
    const py = all.filter((q) => q.family === 'python');
    // The expression is read back from the question text by this test's own parser.
    const fromText = py.map((q) => {
      let m = /^What is (\d+) to the power of (\d+)\?$/.exec(q.question);
      if (m) return `${m[1]} ** ${m[2]}`;
      m = /^What is the remainder when (\d+) is divided by (\d+)\?$/.exec(q.question);
      if (m) return `${m[1]} % ${m[2]}`;
      m = /^What is ([\d ()+*-]+)\?$/.exec(q.question);
      if (m) return m[1] as string;
      throw new Error(`unparsed python question ${q.question}`);
    });
    expect(pythonEval(fromText)).toEqual(py.map((q) => q.groundTruth));
    const both = all.filter((q) => q.family === 'both');
    expect(pythonEval(both.map((q) => q.expression as string))).toEqual(both.map((q) => q.groundTruth));
    for (const q of [...py, ...both]) expect(q.groundTruth).toMatch(/^\d+$/); // exact non-negative integers
  });

  it('finds every operand of a both question in the corpus next to its entity', () => {
    for (const q of all.filter((x) => x.family === 'both')) {
      const operands = (q.expression as string).match(/\d+/g) as string[];
      expect(operands).toHaveLength(2);
      const names = q.entities.map((id) => entityById(world, id).name);
      for (const n of names) expect(q.question.includes(n) || q.template === 'both.founder_age').toBe(true);
      // Each operand is stated in a sentence that names one of the question's entities.
      for (const x of operands) {
        const ok = sentences.some(({ doc, s }) => doc.role === 'fact' && mentions(s, x) && names.some((n) => mentions(s, n)));
        if (!ok) throw new Error(`${q.question}: operand ${x} not stated for ${names.join(', ')}`);
      }
    }
  });

  it('keeps splits disjoint: entities per split, python expressions across splits', () => {
    const bySplit = SPLITS.map((s) => new Set(questions[s].flatMap((q) => q.entities)));
    for (let i = 0; i < 3; i++) {
      for (let j = i + 1; j < 3; j++) {
        const shared = [...(bySplit[i] as Set<string>)].filter((e) => (bySplit[j] as Set<string>).has(e));
        expect(shared).toEqual([]);
      }
    }
    for (const s of SPLITS) for (const q of questions[s]) for (const id of q.entities) expect(entityById(world, id).split).toBe(s);
    const exprs = all.filter((q) => q.family === 'python').map((q) => q.expression);
    expect(new Set(exprs).size).toBe(exprs.length);
    const texts = all.map((q) => q.question);
    expect(new Set(texts).size).toBe(texts.length);
  });

  it('has the requested sizes and family mix, with ids unique', () => {
    expect(questions.train).toHaveLength(800);
    expect(questions.valid).toHaveLength(100);
    expect(questions.test).toHaveLength(200);
    const fam = (s: 'train' | 'test', f: string) => questions[s].filter((q) => q.family === f).length;
    expect([fam('test', 'search'), fam('test', 'python'), fam('test', 'both')]).toEqual([80, 50, 70]);
    expect(new Set(all.map((q) => q.id)).size).toBe(all.length);
    for (const q of all) expect(q.needs).toEqual(q.family === 'both' ? ['search', 'python'] : [q.family]);
    // Pair templates are balanced (round-robin), not dominated by the largest pool.
    const pairTemplates = new Set(questions.train.filter((q) => q.family === 'both').map((q) => q.template));
    expect(pairTemplates.size).toBe(5);
  });

  it('explains when the world is too small for the requested questions', () => {
    const small: World = generateWorld(3, { ...DEFAULT_WORLD_SIZES, cities: 6, people: 6, companies: 3, mountains: 6 });
    expect(() => generateQuestions(small, { train: 2000, valid: 10, test: 10, familyMix: { search: 1, python: 0, both: 0 } }))
      .toThrow(/asked for 2000 search questions but its entities support only \d+/);
    expect(() => generateQuestions(small, { train: 10, valid: 10, test: 10, familyMix: { search: 0.5, python: 0.6, both: 0 } }))
      .toThrow('sizes.questions.familyMix');
  });
});
