// Prompt building: the row's chat messages (or a system prompt plus the
// question) through an injected chat template, so lib/data does not depend
// on the tokenizer (lib/model supplies `applyChatTemplate`).
import { invalidArgument } from '../errors';
import type { ChatMessage, DatasetExample } from './rows';

/** Renders messages as the model sees them: text, or token ids directly. */
export type ChatTemplate = (messages: readonly ChatMessage[]) => string | Int32Array;

/**
 * The ARPO reference's system prompt, as intended. Its RL datasets carry it
 * with each `\boxed` written as a backspace (U+0008) + `oxed` (an unescaped
 * "\b" in the Python that built them); rows keep what the file says.
 */
export const ARPO_SYSTEM_PROMPT =
  'You are a helpful assistant that can solve the given question step by step with the help of the wikipedia search tool and python interpreter tool. ' +
  'Given a question, you need to first think about the reasoning process in the mind and then provide the answer. ' +
  'During thinking, you can invoke the wikipedia search tool to search and python interpreter tool to calculate the math problem for fact information about specific topics if needed. ' +
  'The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags respectively, and the search query and result are enclosed within <search> </search> and <result> </result> tags respectively. ' +
  'For example, <think> This is the reasoning process. </think> <search> search query here </search> <result> search result here </result> <think> This is the reasoning process. </think> <python> python code here </python> <result> python interpreter result here </result> <think> This is the reasoning process. </think> <answer> The final answer is \\[ \\boxed{answer here} \\] </answer>. ' +
  'In the last part of the answer, the final exact answer is enclosed within \\boxed{} with latex format.';

export interface PromptOptions {
  /**
   * `dataset` (default): the row's own `prompt` messages, falling back to
   * `question` when a row has none; `question`: always a system prompt plus the question.
   */
  readonly source?: 'dataset' | 'question';
  /** System prompt for `question` prompts (default: ARPO_SYSTEM_PROMPT; '' for none). With `dataset`, when set, it replaces the rows' system message. */
  readonly systemPrompt?: string;
}

/** The chat messages a prompt is built from. */
export function promptMessages(example: DatasetExample, options: PromptOptions = {}): ChatMessage[] {
  const source = options.source ?? 'dataset';
  if (source !== 'dataset' && source !== 'question') throw invalidArgument('"dataset" or "question"', 'source', source);
  if (options.systemPrompt !== undefined && typeof options.systemPrompt !== 'string') throw invalidArgument('a string', 'systemPrompt', options.systemPrompt);
  if (source === 'dataset' && example.messages) {
    if (options.systemPrompt === undefined) return [...example.messages];
    const rest = example.messages.filter((m) => m.role !== 'system');
    return options.systemPrompt.length > 0 ? [{ role: 'system', content: options.systemPrompt }, ...rest] : rest;
  }
  const system = options.systemPrompt ?? ARPO_SYSTEM_PROMPT;
  const user: ChatMessage = { role: 'user', content: example.question };
  return system.length > 0 ? [{ role: 'system', content: system }, user] : [user];
}

/** The prompt for one example: the template applied to its messages. */
export function buildPrompt(example: DatasetExample, template: ChatTemplate, options: PromptOptions = {}): string | Int32Array {
  if (typeof template !== 'function') throw invalidArgument('a chat template function (messages) => string | Int32Array', 'template', template);
  const out = template(promptMessages(example, options));
  if (typeof out !== 'string' && !(out instanceof Int32Array)) throw invalidArgument('a string or Int32Array', 'the chat template result', out);
  return out;
}
