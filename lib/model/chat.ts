// Chat prompts: the checkpoint's Jinja chat template rendered through
// @huggingface/jinja (as transformers' apply_chat_template does) into text and
// token ids. The ids are the trajectory's first tokens; nothing is re-tokenised later.
import { Template } from '@huggingface/jinja';
import { ArpoError, invalidArgument } from '../errors';
import type { Tokenizer } from './tokenizer';

export interface ChatMessage {
  readonly role: string; // system | user | assistant | tool
  readonly content: string;
  /** Optional fields some templates read (Qwen3: reasoning_content, tool_calls). */
  readonly reasoning_content?: string;
  readonly tool_calls?: readonly unknown[];
  readonly name?: string;
  readonly tool_call_id?: string;
}

/** An OpenAI-style function tool, passed to the template's `tools`. */
export interface ChatTool {
  type: 'function';
  function: { name: string; description?: string; parameters?: Record<string, unknown> };
}

export interface ChatTemplateOptions {
  tools?: readonly ChatTool[];
  /** Append the assistant turn opener (e.g. `<|im_start|>assistant\n`). */
  addGenerationPrompt: boolean;
  /** Qwen3: false adds an empty `<think>\n\n</think>\n\n` block (thinking off); undefined leaves it to the template. */
  enableThinking?: boolean;
  /** Further template variables. */
  extra?: Record<string, unknown>;
}

export interface ChatPrompt {
  text: string;
  ids: Int32Array;
}

const compiled = new WeakMap<Tokenizer, Template>();

function templateOf(tokenizer: Tokenizer): Template {
  let t = compiled.get(tokenizer);
  if (!t) {
    if (tokenizer.chatTemplate === null) throw new ArpoError('BAD_CHECKPOINT', `${tokenizer.source}: the tokenizer has no chat_template`);
    try {
      t = new Template(tokenizer.chatTemplate);
    } catch (e) {
      throw new ArpoError('BAD_CHECKPOINT', `${tokenizer.source}: chat_template does not parse (${(e as Error).message})`);
    }
    compiled.set(tokenizer, t);
  }
  return t;
}

/** Renders the chat template to text (no tokenisation). */
export function renderChatTemplate(tokenizer: Tokenizer, messages: readonly ChatMessage[], options: ChatTemplateOptions): string {
  if (!Array.isArray(messages) || messages.length === 0) throw invalidArgument('a non-empty array of messages', 'messages', messages);
  messages.forEach((m, i) => {
    if (m === null || typeof m !== 'object' || typeof m.role !== 'string') throw invalidArgument('a message {role, content}', `messages[${i}]`, m);
    if (typeof m.content !== 'string') throw invalidArgument('a string', `messages[${i}].content`, m.content);
  });
  const context: Record<string, unknown> = {
    ...tokenizer.templateTokens,
    ...options.extra,
    messages: messages.map((m) => ({ ...m })),
    add_generation_prompt: options.addGenerationPrompt,
  };
  if (options.tools !== undefined && options.tools.length > 0) context.tools = options.tools;
  if (options.enableThinking !== undefined) context.enable_thinking = options.enableThinking;
  try {
    return templateOf(tokenizer).render(context);
  } catch (e) {
    throw new ArpoError('BAD_DATA', `${tokenizer.source}: chat template failed: ${(e as Error).message}`);
  }
}

/**
 * The prompt as text and token ids. Like transformers' apply_chat_template,
 * the rendered text is encoded without adding special tokens (the template
 * writes them), so special-token strings in it map to their ids.
 */
export function applyChatTemplate(tokenizer: Tokenizer, messages: readonly ChatMessage[], options: ChatTemplateOptions): ChatPrompt {
  const text = renderChatTemplate(tokenizer, messages, options);
  return { text, ids: tokenizer.encode(text, { addSpecialTokens: false }) };
}
