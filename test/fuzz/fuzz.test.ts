// Seeded mutation fuzzing of the parsers that read what strangers give us
// (checkpoints, configs, datasets, model text, MCP replies): every case is a
// result or an ArpoError naming the file or field, never another exception.
// CI runs ARPO_FUZZ_CASES cases per target (default 1000, each target at most
// ~20 s); `npm run fuzz -- --minutes N` runs the same targets for longer.
import * as fs from 'fs';
import { fuzzDir, makeTargets } from './targets';

const CASES = Number(process.env.ARPO_FUZZ_CASES ?? 1000);
const SEED = Number(process.env.ARPO_FUZZ_SEED ?? 20261203);
const dir = fuzzDir();
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

describe.each(makeTargets(dir).map((t) => [t.name, t] as const))('fuzz: %s', (_name, target) => {
  if (target.skip) console.warn(`fuzz: ${target.name} skipped: ${target.skip}`);
  (target.skip ? test.skip : test)(`${CASES} seeded cases: a result or a clean ArpoError`, async () => {
    const failures: string[] = [];
    const counts = { ok: 0, rejected: 0 };
    const t0 = Date.now();
    let i = 0;
    for (; i < CASES && Date.now() - t0 < 20000; i++) {
      try {
        counts[await target.run(SEED, i)]++;
      } catch (e) {
        failures.push(`case ${i} (seed ${SEED}): ${(e as Error).message}`);
        if (failures.length >= 5) break;
      }
    }
    expect(failures).toEqual([]);
    // Both outcomes occur: the mutations reach past the first check and the seeds stay valid.
    expect(counts.ok).toBeGreaterThan(0);
    if (target.name !== 'tool-call protocol parser') expect(counts.rejected).toBeGreaterThan(0);
    expect(i).toBeGreaterThanOrEqual(Math.min(CASES, 200));
  }, 60000);
});

// Each defect the fuzzers found, kept as a regression test (case and seed in the name).
describe('fuzz regressions', () => {
  const { resultText } = require('../../lib/tools/mcp') as typeof import('../../lib/tools/mcp');
  const { readModelConfig, tinyConfig } = require('../../lib/model/checkpoint') as typeof import('../../lib/model/checkpoint');
  const tok = require('../../lib/model/tokenizer') as typeof import('../../lib/model/tokenizer');
  const path = require('path') as typeof import('path');

  test('replay-cache row whose meta is not JSON or whose ms is text (seed 20261203, cases 0 and 8)', () => {
    const { ToolCallCache, callKey } = require('../../lib/tools/replay') as typeof import('../../lib/tools/replay');
    const Database = require('better-sqlite3') as typeof import('better-sqlite3');
    const file = path.join(dir, 'bad-replay.sqlite');
    const k = callKey('python', 'k', 'print(1)');
    const c = ToolCallCache.open(file);
    c.put('python', k, 'print(1)', { text: '1', ok: true, ms: 3, meta: { a: 1 } });
    c.close();
    const raw = new Database(file);
    raw.prepare('UPDATE tool_calls SET meta = ?').run('{"a": 1}}');
    const reopened = ToolCallCache.open(file);
    expect(() => reopened.get('python', k)).toThrow(new RegExp(`^${file.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}: tool_calls row \\(tool "python"\\): expected JSON text \\(.*\\) for meta but received "\\{\\\\"a\\\\": 1\\}\\}"`));
    raw.prepare('UPDATE tool_calls SET meta = NULL, ms = ?').run('fast');
    expect(() => reopened.get('python', k)).toThrow('expected a finite number >= 0 for ms but received "fast" of type string');
    reopened.close();
    raw.close();
  });

  test('MCP reply whose content is not an array, or holds null (seed 20261203, cases 22-23 and 62)', () => {
    expect(() => resultText({ content: 0 } as never)).toThrow('MCP tool reply: expected an array for content but received 0 of type number');
    expect(() => resultText({ content: [{ type: 'text', text: 'a' }, null] } as never)).toThrow('MCP tool reply: expected an object with a string type for content[1] but received null');
    expect(() => resultText(null as never)).toThrow('MCP tool reply: expected an object for the reply but received null');
    expect(resultText({ content: [{ type: 'resource', resource: { uri: 7 as never } }, { type: 'image', mimeType: 3 as never }] })).toBe('[resource ]\n[image]');
  });

  test('config.json with a 15,000-deep array is a BAD_CONFIG naming the field, not a stack overflow (seed 20261203, case 30)', () => {
    const d = path.join(dir, 'deep-config');
    fs.mkdirSync(d, { recursive: true });
    const deep = `${'['.repeat(15000)}${']'.repeat(15000)}`;
    fs.writeFileSync(path.join(d, 'config.json'), JSON.stringify(tinyConfig('qwen3')).replace(/"hidden_size":\d+/, `"hidden_size":${deep}`));
    expect(() => readModelConfig(d)).toThrow(/config\.json: expected .* for hidden_size but received Array\(1\) of type array/);
  });

  test('tokenizer.json with a token id beyond int32 or a chat_template list holding null (seed 20261203, cases 727 and 1443)', () => {
    const d = path.join(dir, 'bad-tok');
    fs.mkdirSync(d, { recursive: true });
    tok.writeTokenizerFiles(d, tok.buildTinyBpeTokenizer(['Paris']));
    const file = path.join(d, 'tokenizer.json');
    const good = fs.readFileSync(file, 'utf8');
    const j = JSON.parse(good);
    j.model.vocab.P = 2 ** 32 - 1; // wrapped to -1 in the Int32Array of ids before the fix
    fs.writeFileSync(file, JSON.stringify(j));
    expect(() => tok.Tokenizer.fromDir(d)).toThrow(`${file}: expected a token id (an integer in [0, 2147483647]) for model.vocab["P"] but received 4294967295 of type number`);
    fs.writeFileSync(file, good);
    const cfgFile = path.join(d, 'tokenizer_config.json');
    const cfg = JSON.parse(fs.readFileSync(cfgFile, 'utf8'));
    fs.writeFileSync(cfgFile, JSON.stringify({ ...cfg, chat_template: [null, { name: 'default', template: 'x' }] }));
    expect(() => tok.Tokenizer.fromDir(d)).toThrow('expected an object {name, template} for chat_template[0] but received null');
  });
});
