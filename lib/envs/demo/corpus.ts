// The demo's search corpus: short encyclopedia documents `{id, title, text}` stating each entity's
// facts in varied sentence templates, plus distractors (look-alike decoys, namesake landmarks); JSONL on disk.
import * as fs from 'fs';
import * as path from 'path';
import { Rng } from './rng';
import { entityById, type City, type Company, type Entity, type Mountain, type Person, type World } from './world';

/** One corpus line, the shape the search tool indexes. */
export interface CorpusDoc {
  readonly id: string;
  readonly title: string;
  readonly text: string;
}

/** What a document is about (kept in memory for tests and the manifest; not written to the JSONL). */
export interface CorpusDocInfo extends CorpusDoc {
  /** `fact`: an entity's facts; `decoy`: a look-alike's facts; `namesake`: a landmark named after an entity. */
  readonly role: 'fact' | 'decoy' | 'namesake';
  readonly entityId: string;
}

type Template<T> = (e: T, w: World) => string;

/** `a painter`, `an architect`. */
export function withArticle(noun: string): string {
  return /^[aeiou]/i.test(noun) ? `an ${noun}` : `a ${noun}`;
}

// Every template of one fact shares a keyword (country, founded, population, born, occupation,
// headquarters, employees, makes, height, first ascent) so that the trace queries `<name> <keyword>` match the
// fact document under both AND (FTS5's default) and OR query semantics.

const cityIntro: Template<City>[] = [
  (c) => `${c.name} is a city in the country of ${c.country}.`,
  (c) => `${c.name} is a town in the country of ${c.country}.`,
  (c) => `The city of ${c.name} lies in the country of ${c.country}.`,
];
const cityPopulation: Template<City>[] = [
  (c) => `${c.name} has a population of ${c.population}.`,
  (c) => `The population of ${c.name} is ${c.population}.`,
  (c) => `With a population of ${c.population}, ${c.name} is a busy place.`,
];
const cityFounded: Template<City>[] = [
  (c) => `${c.name} was founded in ${c.foundedYear}.`,
  (c) => `The city of ${c.name} was founded in the year ${c.foundedYear}.`,
  (c) => `Founded in ${c.foundedYear}, ${c.name} began as a small river port.`,
];
const cityFlavor = ['It is known for its old bridges.', 'Its market square is the largest in the region.', 'The town is famous for its gardens.', 'Many canals cross the old quarter.'];

const personBorn: Template<Person>[] = [
  (p, w) => `${p.name} was born in ${p.birthYear} in ${entityById(w, p.birthCity).name}.`,
  (p, w) => `${p.name} was born in the city of ${entityById(w, p.birthCity).name} in ${p.birthYear}.`,
  (p, w) => `Born in ${entityById(w, p.birthCity).name} in the year ${p.birthYear}, ${p.name} grew up near the harbour.`,
];
const personOccupation: Template<Person>[] = [
  (p) => `${p.name} was ${withArticle(p.occupation)} by occupation.`,
  (p) => `By occupation, ${p.name} was ${withArticle(p.occupation)}.`,
  (p) => `The occupation of ${p.name} was that of ${withArticle(p.occupation)}.`,
];
const personFlavor = ['Several letters from that time survive.', 'A street was later named in that honour.', 'Little is known about the early years.'];

const companyProfile: Template<Company>[] = [
  (c, w) => `${c.name} is a company with headquarters in ${entityById(w, c.headquarters).name}. ${c.name} makes ${c.product}.`,
  (c, w) => `${c.name} has its headquarters in ${entityById(w, c.headquarters).name} and makes ${c.product}.`,
  (c, w) => `The headquarters of ${c.name} are in ${entityById(w, c.headquarters).name}. Today ${c.name} makes ${c.product}.`,
];
const companyEmployees: Template<Company>[] = [
  (c) => `${c.name} has ${c.employees} employees.`,
  (c) => `The number of employees of ${c.name} is ${c.employees}.`,
  (c) => `With ${c.employees} employees, ${c.name} trades across the region.`,
];
const companyFounded: Template<Company>[] = [
  (c, w) => `${c.name} was founded in ${c.foundedYear} by ${entityById(w, c.founder).name}.`,
  (c, w) => `${entityById(w, c.founder).name} founded ${c.name} in ${c.foundedYear}.`,
  (c, w) => `In ${c.foundedYear}, ${entityById(w, c.founder).name} founded ${c.name}.`,
];

const mountainHeight: Template<Mountain>[] = [
  (m) => `${m.name} has a height of ${m.heightM} metres.`,
  (m) => `The height of ${m.name} is ${m.heightM} metres.`,
  (m) => `${m.name} rises to a height of ${m.heightM} metres.`,
];
const mountainIntro: Template<Mountain>[] = [
  (m) => `${m.name} is a mountain in the country of ${m.country}.`,
  (m) => `${m.name} stands in the country of ${m.country}.`,
];
const mountainAscent: Template<Mountain>[] = [
  (m) => `The first ascent of ${m.name} was in ${m.firstAscentYear}.`,
  (m) => `${m.name} saw its first ascent in ${m.firstAscentYear}.`,
  (m) => `The first ascent of ${m.name} took place in ${m.firstAscentYear}.`,
];

/** The documents that state one entity's (or decoy's) facts. */
function factDocs(e: Entity, w: World, rng: Rng): { title: string; text: string }[] {
  switch (e.kind) {
    case 'city':
      return [
        { title: e.name, text: [rng.pick(cityIntro)(e, w), rng.pick(cityPopulation)(e, w), rng.pick(cityFlavor)].join(' ') },
        { title: `History of ${e.name}`, text: [rng.pick(cityFounded)(e, w), 'The old walls were rebuilt two centuries later.'].join(' ') },
      ];
    case 'person':
      return [{ title: e.name, text: [rng.pick(personBorn)(e, w), rng.pick(personOccupation)(e, w), rng.pick(personFlavor)].join(' ') }];
    case 'company':
      return [
        { title: e.name, text: [rng.pick(companyProfile)(e, w), rng.pick(companyEmployees)(e, w)].join(' ') },
        { title: `History of ${e.name}`, text: rng.pick(companyFounded)(e, w) },
      ];
    case 'mountain':
      return [{ title: e.name, text: [rng.pick(mountainIntro)(e, w), rng.pick(mountainHeight)(e, w), rng.pick(mountainAscent)(e, w)].join(' ') }];
  }
}

/** A landmark named after an entity, with numbers of the same kind as its facts: a distractor for careless reading. */
function namesakeDoc(e: Entity, rng: Rng): { title: string; text: string } {
  switch (e.kind) {
    case 'city':
      return rng.chance(0.5)
        ? { title: `${e.name} Festival`, text: `The ${e.name} Festival was first held in ${rng.int(1700, 2000)}. It draws ${rng.int(2000, 90000)} visitors every summer.` }
        : { title: `${e.name} Bridge`, text: `The ${e.name} Bridge was opened in ${rng.int(1700, 2000)}. It is ${rng.int(40, 900)} metres long.` };
    case 'person':
      return { title: `${e.name} Prize`, text: `The ${e.name} Prize has been awarded since ${rng.int(1850, 2010)}. It comes with ${rng.int(500, 20000)} coins.` };
    case 'company':
      return { title: `${e.name} Museum`, text: `The ${e.name} Museum opened in ${rng.int(1900, 2015)}. It shows ${rng.int(50, 3000)} objects.` };
    case 'mountain': {
      const word = e.name.slice('Mount '.length);
      return { title: `${word} Pass`, text: `The ${word} Pass crosses the range at ${rng.int(600, 5000)} metres. It was first used in ${rng.int(1500, 1900)}.` };
    }
  }
}

/**
 * Generates the corpus for a world: fact documents for every entity and decoy,
 * and a namesake landmark for a `namesakeFraction` of the real entities.
 * Documents are shuffled (seeded) so that no id order leaks which is a decoy.
 */
export function generateCorpus(world: World, namesakeFraction = 0.3): CorpusDocInfo[] {
  const rng = Rng.forStream(world.seed, 'corpus');
  const draft: Omit<CorpusDocInfo, 'id'>[] = [];
  for (const e of world.entities) {
    const role = e.split === null ? 'decoy' : 'fact';
    for (const d of factDocs(e, world, rng)) draft.push({ ...d, role, entityId: e.id });
    if (e.split !== null && rng.chance(namesakeFraction)) draft.push({ ...namesakeDoc(e, rng), role: 'namesake', entityId: e.id });
  }
  return rng.shuffled(draft).map((d, i) => ({ id: `doc-${String(i + 1).padStart(4, '0')}`, ...d }));
}

/** The JSONL text of a corpus: one `{id, title, text}` object per line. */
export function corpusJsonl(docs: readonly CorpusDoc[]): string {
  return docs.map((d) => JSON.stringify({ id: d.id, title: d.title, text: d.text })).join('\n') + '\n';
}

/** Writes `corpus.jsonl` into dir (created if missing) and returns its path. */
export function writeCorpus(dir: string, docs: readonly CorpusDoc[]): string {
  fs.mkdirSync(dir, { recursive: true });
  const file = path.join(dir, 'corpus.jsonl');
  fs.writeFileSync(file, corpusJsonl(docs));
  return file;
}
