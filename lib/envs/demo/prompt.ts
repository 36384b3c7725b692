// The demo's system prompt (the reference's deep-research prompt, shortened to the demo world)
// and its ChatML chat template, the one written into the demo tokenizer_config.json.

/** System prompt: the tag protocol of ARPO.md, with a one-line worked example. */
export const DEMO_SYSTEM_PROMPT =
  'You are a helpful assistant that answers questions about a fictional world. ' +
  'Its facts are only in an encyclopedia that you can search, and you have a python interpreter for arithmetic. ' +
  'Think inside <think> </think>. To search, write <search> query </search>; to run code, write <python> print(expression) </python>; ' +
  'each result comes back inside <result> </result>. ' +
  'Give the final answer inside <answer> </answer> with the exact answer in \\boxed{}. ' +
  'For example: <think> reasoning </think> <search> query </search> <result> search result </result> ' +
  '<think> reasoning </think> <answer> \\boxed{answer} </answer>';

/**
 * ChatML (the Qwen2/Qwen3 layout without tool-call or thinking extras):
 * `<|im_start|>{role}\n{content}<|im_end|>\n` per message, then
 * `<|im_start|>assistant\n` when a generation prompt is asked for.
 */
export const DEMO_CHAT_TEMPLATE =
  "{%- for message in messages %}" +
  "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}" +
  '{%- endfor %}' +
  "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

export interface ChatMessage {
  readonly role: 'system' | 'user' | 'assistant';
  readonly content: string;
}

/** The same rendering as DEMO_CHAT_TEMPLATE, in plain TS (tests hold the two equal). */
export function renderChatML(messages: readonly ChatMessage[], addGenerationPrompt: boolean): string {
  let out = '';
  for (const m of messages) out += `<|im_start|>${m.role}\n${m.content}<|im_end|>\n`;
  return addGenerationPrompt ? `${out}<|im_start|>assistant\n` : out;
}
