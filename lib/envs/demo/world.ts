// The demo's synthetic world: invented cities, people, companies and mountains
// with numeric and categorical facts, a pure function of the seed (facts exist only in the generated corpus).
import { ArpoError, invalidArgument } from '../../errors';
import { Rng } from './rng';

export type Split = 'train' | 'valid' | 'test';
export const SPLITS: readonly Split[] = ['train', 'valid', 'test'];

interface EntityBase {
  /** Stable id, e.g. `city-007`. */
  readonly id: string;
  /** Display name as written in the corpus and the questions. */
  readonly name: string;
  /** Which question split may ask about it; null for a decoy (a look-alike that only lives in the corpus). */
  readonly split: Split | null;
  /** For a decoy: the id of the entity whose name it imitates. */
  readonly decoyOf: string | null;
}

export interface City extends EntityBase {
  readonly kind: 'city';
  readonly country: string;
  readonly foundedYear: number;
  readonly population: number;
}

export interface Person extends EntityBase {
  readonly kind: 'person';
  readonly birthYear: number;
  /** City id (same split as the person). */
  readonly birthCity: string;
  readonly occupation: string;
}

export interface Company extends EntityBase {
  readonly kind: 'company';
  readonly foundedYear: number;
  /** Person id (same split as the company). */
  readonly founder: string;
  /** City id (same split as the company). */
  readonly headquarters: string;
  readonly employees: number;
  readonly product: string;
}

export interface Mountain extends EntityBase {
  readonly kind: 'mountain';
  readonly heightM: number;
  readonly country: string;
  readonly firstAscentYear: number;
}

export type Entity = City | Person | Company | Mountain;
export type EntityKind = Entity['kind'];

export interface WorldSizes {
  readonly countries: number;
  readonly cities: number;
  readonly people: number;
  readonly companies: number;
  readonly mountains: number;
  /** Fraction of entities that get a look-alike decoy (one syllable changed, other facts). */
  readonly decoyFraction: number;
  /** Share of each kind's entities per question split (must sum to 1). */
  readonly splitFractions: Readonly<Record<Split, number>>;
}

export const DEFAULT_WORLD_SIZES: WorldSizes = Object.freeze({
  countries: 8,
  cities: 50,
  people: 60,
  companies: 40,
  mountains: 30,
  decoyFraction: 0.25,
  splitFractions: Object.freeze({ train: 0.6, valid: 0.15, test: 0.25 }),
});

export interface World {
  readonly seed: number;
  readonly countries: readonly string[];
  /** Question-bearing entities, then decoys (split null). */
  readonly entities: readonly Entity[];
  /** Every invented word -> the syllables it was built from (lets the tokenizer stay compositional over names). */
  readonly lexicon: Readonly<Record<string, readonly string[]>>;
}

/** Syllables for invented names: short, pronounceable, and not English words on their own. */
// Every syllable starts with a consonant, and no syllable ends with a letter that starts a
// consonant cluster of another (b, d, q, t, w): then the tokenizer's syllable merges can never
// straddle a syllable boundary (see syllableMerges in tokenizer.ts).
export const SYLLABLES: readonly string[] = [
  'vel', 'mor', 'qua', 'tar', 'ka', 'resh', 'lo', 'den', 'sa', 'vi', 'ren', 'tho', 'bra', 'nel', 'dor', 'mi',
  'zan', 'ko', 'lum', 'fen', 'gar', 'ri', 'su', 'tam', 'bel', 'cor', 'dru', 'fal', 'hal', 'jor', 'lin', 'mar',
  'nos', 'pel', 'quo', 'ros', 'sel', 'tin', 'vos', 'wyn', 'yar', 'zel', 'bri', 'cal', 'dez', 'nir', 'gol', 'kel',
];

export const OCCUPATIONS = ['painter', 'engineer', 'botanist', 'composer', 'architect', 'sailor', 'chemist', 'poet', 'astronomer', 'merchant'];
export const PRODUCTS = ['glass', 'clocks', 'ships', 'textiles', 'paper', 'bicycles', 'lamps', 'ceramics', 'rope', 'telescopes'];
export const COMPANY_SUFFIXES = ['Works', 'Industries', 'Trading', 'Mills', 'Foundry', 'Company'];

function capitalize(s: string): string {
  return s.charAt(0).toUpperCase() + s.slice(1);
}

interface SyllablePool {
  readonly first: readonly string[];
  readonly later: readonly string[];
}

/** Draws invented words that are unique across the whole world. */
class NameMaker {
  readonly lexicon: Record<string, string[]> = {};
  private readonly used = new Set<string>();

  constructor(private readonly rng: Rng) {}

  /** A fresh capitalised word of minSyl..maxSyl syllables, drawn from `pool` (first / later syllables) when given. */
  word(minSyl: number, maxSyl: number, pool?: SyllablePool): string {
    for (let attempt = 0; attempt < 10000; attempt++) {
      const n = this.rng.int(minSyl, maxSyl);
      const syl: string[] = [];
      for (let i = 0; i < n; i++) syl.push(this.rng.pick(pool ? (i === 0 ? pool.first : pool.later) : SYLLABLES));
      const w = capitalize(syl.join(''));
      if (this.claim(w, syl)) return w;
    }
    throw new ArpoError('BAD_CONFIG', 'demo world: ran out of unique invented names; lower the world sizes');
  }

  /** A look-alike of an existing word: one syllable replaced (returns null if none is free). */
  lookalike(word: string): string | null {
    const syl = this.lexicon[word];
    if (!syl) return null;
    for (let attempt = 0; attempt < 200; attempt++) {
      const alt = syl.slice();
      const i = this.rng.int(0, alt.length - 1);
      alt[i] = this.rng.pick(SYLLABLES);
      const w = capitalize(alt.join(''));
      if (this.claim(w, alt)) return w;
    }
    return null;
  }

  /** Syllables used at least twice as a first / later syllable in the words made so far. */
  usedSyllables(): SyllablePool {
    const first = new Map<string, number>();
    const later = new Map<string, number>();
    for (const syl of Object.values(this.lexicon)) {
      syl.forEach((s, i) => {
        const m = i === 0 ? first : later;
        const key = s.toLowerCase();
        m.set(key, (m.get(key) ?? 0) + 1);
      });
    }
    const keep = (m: Map<string, number>) => SYLLABLES.filter((s) => (m.get(s) ?? 0) >= 2);
    return { first: keep(first), later: keep(later) };
  }

  private claim(word: string, syllables: string[]): boolean {
    const key = word.toLowerCase();
    if (this.used.has(key)) return false;
    this.used.add(key);
    this.lexicon[word] = [capitalize(syllables[0] ?? ''), ...syllables.slice(1)];
    return true;
  }
}

function checkSizes(sizes: WorldSizes): void {
  const counts: [keyof WorldSizes, number][] = [
    ['countries', 2],
    ['cities', 6],
    ['people', 6],
    ['companies', 3],
    ['mountains', 6],
  ];
  for (const [key, min] of counts) {
    const v = sizes[key];
    if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > 5000) {
      throw invalidArgument(`an integer in [${min}, 5000]`, `sizes.world.${key}`, v);
    }
  }
  if (typeof sizes.decoyFraction !== 'number' || !(sizes.decoyFraction >= 0 && sizes.decoyFraction <= 1)) {
    throw invalidArgument('a number in [0, 1]', 'sizes.world.decoyFraction', sizes.decoyFraction);
  }
  const f = sizes.splitFractions;
  const total = SPLITS.reduce((s, k) => s + (typeof f?.[k] === 'number' ? f[k] : NaN), 0);
  if (!(Math.abs(total - 1) < 1e-9) || SPLITS.some((k) => !(f[k] > 0))) {
    throw invalidArgument('positive train/valid/test fractions summing to 1', 'sizes.world.splitFractions', f);
  }
}

/** Assigns splits to n items in proportion, every split getting at least one. */
function splitAssignment(rng: Rng, n: number, fractions: Readonly<Record<Split, number>>): Split[] {
  const nValid = Math.max(1, Math.round(n * fractions.valid));
  const nTest = Math.max(1, Math.round(n * fractions.test));
  const nTrain = n - nValid - nTest;
  if (nTrain < 1) throw invalidArgument('enough entities for three splits', 'sizes.world', n);
  const labels: Split[] = [];
  for (let i = 0; i < nTrain; i++) labels.push('train');
  for (let i = 0; i < nValid; i++) labels.push('valid');
  for (let i = 0; i < nTest; i++) labels.push('test');
  return rng.shuffled(labels);
}

function pad3(i: number): string {
  return String(i).padStart(3, '0');
}

/**
 * Builds the world. Entities are split by kind into train/valid/test so that
 * held-out questions are about entities never asked about in training: a
 * company's founder and headquarters, and a person's birth city, are drawn
 * from the same split as the company or person.
 */
export function generateWorld(seed: number, sizes: WorldSizes = DEFAULT_WORLD_SIZES): World {
  if (typeof seed !== 'number' || !Number.isInteger(seed) || seed < 0 || seed > 0xffffffff) {
    throw invalidArgument('an integer in [0, 2^32)', 'seed', seed);
  }
  checkSizes(sizes);
  const rng = Rng.forStream(seed, 'world');
  const names = new NameMaker(Rng.forStream(seed, 'names'));

  const countries: string[] = [];
  for (let i = 0; i < sizes.countries; i++) countries.push(names.word(2, 3));
  const citySplits = splitAssignment(rng, sizes.cities, sizes.splitFractions);
  const personSplits = splitAssignment(rng, sizes.people, sizes.splitFractions);
  const companySplits = splitAssignment(rng, sizes.companies, sizes.splitFractions);
  const mountainSplits = splitAssignment(rng, sizes.mountains, sizes.splitFractions);
  // Train names first; held-out names then use only syllables that train names use at least twice
  // in the same position, so a held-out name is made of tokens the model has seen in training.
  const shapes: [Split[], (pool?: SyllablePool) => string][] = [
    [citySplits, (pool) => names.word(2, 3, pool)],
    [personSplits, (pool) => `${names.word(2, 2, pool)} ${names.word(2, 3, pool)}`],
    [companySplits, (pool) => names.word(2, 3, pool)],
    [mountainSplits, (pool) => names.word(2, 3, pool)],
  ];
  const drawn: string[][] = shapes.map(([splits, make]) => splits.map((s) => (s === 'train' ? make() : '')));
  const trained = names.usedSyllables();
  shapes.forEach(([splits, make], k) => splits.forEach((s, i) => {
    if (s !== 'train') (drawn[k] as string[])[i] = make(trained);
  }));
  const [cityNames, personNames, companyNames, mountainNames] = drawn as [string[], string[], string[], string[]];

  const cities: City[] = [];
  for (let i = 0; i < sizes.cities; i++) {
    cities.push({
      kind: 'city', id: `city-${pad3(i)}`, name: cityNames[i] as string, split: citySplits[i] as Split, decoyOf: null,
      country: rng.pick(countries), foundedYear: rng.int(1050, 1900), population: rng.int(1200, 2900000),
    });
  }
  const citiesIn = (split: Split) => cities.filter((c) => c.split === split);

  const people: Person[] = [];
  for (let i = 0; i < sizes.people; i++) {
    const split = personSplits[i] as Split;
    const city = rng.pick(citiesIn(split));
    people.push({
      kind: 'person', id: `person-${pad3(i)}`, name: personNames[i] as string, split, decoyOf: null,
      birthYear: Math.max(rng.int(1780, 1960), city.foundedYear + 1), birthCity: city.id, occupation: rng.pick(OCCUPATIONS),
    });
  }

  const companies: Company[] = [];
  for (let i = 0; i < sizes.companies; i++) {
    const split = companySplits[i] as Split;
    const founder = rng.pick(people.filter((p) => p.split === split));
    companies.push({
      kind: 'company', id: `company-${pad3(i)}`, name: `${companyNames[i] as string} ${rng.pick(COMPANY_SUFFIXES)}`, split, decoyOf: null,
      // Founded when the founder was 22..60 years old: the "founder's age" question needs it positive.
      foundedYear: founder.birthYear + rng.int(22, 60), founder: founder.id, headquarters: rng.pick(citiesIn(split)).id,
      employees: rng.int(12, 95000), product: rng.pick(PRODUCTS),
    });
  }

  const mountains: Mountain[] = [];
  const mountainHeights = new Set<number>();
  for (let i = 0; i < sizes.mountains; i++) {
    let heightM = rng.int(900, 8700);
    while (mountainHeights.has(heightM)) heightM = rng.int(900, 8700); // distinct: "how much taller" is never 0
    mountainHeights.add(heightM);
    mountains.push({
      kind: 'mountain', id: `mountain-${pad3(i)}`, name: `Mount ${mountainNames[i] as string}`, split: mountainSplits[i] as Split, decoyOf: null,
      heightM, country: rng.pick(countries), firstAscentYear: rng.int(1760, 2015),
    });
  }

  const real: Entity[] = [...cities, ...people, ...companies, ...mountains];
  const decoys: Entity[] = [];
  const decoyRng = Rng.forStream(seed, 'decoys');
  for (const e of real) {
    if (!decoyRng.chance(sizes.decoyFraction)) continue;
    const d = makeDecoy(e, decoyRng, names, decoys.length, cities);
    if (d) decoys.push(d);
  }
  return { seed, countries, entities: [...real, ...decoys], lexicon: names.lexicon };
}

/** A look-alike: the distinctive word of the name changes one syllable; every fact is redrawn. */
function makeDecoy(e: Entity, rng: Rng, names: NameMaker, index: number, cities: readonly City[]): Entity | null {
  const id = `decoy-${pad3(index)}`;
  const base = { id, split: null, decoyOf: e.id };
  switch (e.kind) {
    case 'city': {
      const name = names.lookalike(e.name);
      if (!name) return null;
      return { ...e, ...base, name, foundedYear: rng.int(1050, 1900), population: rng.int(1200, 2900000) };
    }
    case 'person': {
      const [first, last] = e.name.split(' ') as [string, string];
      const alt = names.lookalike(last);
      if (!alt) return null;
      // The decoy's birth city is any city: decoys are never asked about, so splits do not matter.
      return { ...e, ...base, name: `${first} ${alt}`, birthYear: rng.int(1780, 1960), birthCity: rng.pick(cities).id, occupation: rng.pick(OCCUPATIONS) };
    }
    case 'company': {
      const [word, suffix] = e.name.split(' ') as [string, string];
      const alt = names.lookalike(word);
      if (!alt) return null;
      return { ...e, ...base, name: `${alt} ${suffix}`, foundedYear: rng.int(1820, 2015), employees: rng.int(12, 95000), product: rng.pick(PRODUCTS) };
    }
    case 'mountain': {
      const alt = names.lookalike(e.name.slice('Mount '.length));
      if (!alt) return null;
      return { ...e, ...base, name: `Mount ${alt}`, heightM: rng.int(900, 8700), firstAscentYear: rng.int(1760, 2015) };
    }
  }
}

/** Lookup helpers over a world (ids are unique; a miss is a bug in the caller, so it throws). */
const entityIndex = new WeakMap<World, Map<string, Entity>>();

export function entityById(world: World, id: string): Entity {
  let index = entityIndex.get(world);
  if (!index) {
    index = new Map(world.entities.map((x) => [x.id, x]));
    entityIndex.set(world, index);
  }
  const e = index.get(id);
  if (!e) throw new ArpoError('BAD_DATA', `demo world has no entity with id ${JSON.stringify(id)}`);
  return e;
}

/** Question-bearing entities of one split. */
export function entitiesOfSplit(world: World, split: Split): Entity[] {
  return world.entities.filter((e) => e.split === split);
}
