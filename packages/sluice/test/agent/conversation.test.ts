import { describe, expect, it } from 'vitest';
import { createAgent, type ChatMessage } from 'sluice';
import type { StandInRequest } from '@sluice/testkit';
import { useAgentFixture } from './fixture.js';

const f = useAgentFixture();

/** Each request's messages as role and text, whatever shape the wire gave the content in. */
function seen(requests: StandInRequest[]): { role: string; text: string }[][] {
  const textOf = (content: unknown) =>
    typeof content === 'string'
      ? content
      : (content as { text?: string }[]).map((part) => part.text ?? '').join('');
  return requests.map((r) => r.messages.map((m) => ({ role: m.role, text: textOf(m.content) })));
}

async function recordingAgent(instructions?: string) {
  const requests: StandInRequest[] = [];
  const p = await f.provider({
    reply: (r) => {
      requests.push(r);
      return { text: `answer ${r.index}` };
    },
  });
  const agent = createAgent({ model: f.model(p), credentials: f.credentials, instructions, clock: f.clock });
  return { agent, requests };
}

describe('a run with history and a list of prompt messages', () => {
  it('sends the history, then the prompt, with the system texts after the instructions', async () => {
    const { agent, requests } = await recordingAgent('Be brief.');
    const history: ChatMessage[] = [
      { role: 'system', content: 'The user is called Ada.' },
      { role: 'user', content: 'first question' },
      { role: 'assistant', content: 'first answer' },
    ];
    const result = await agent.run({
      history,
      prompt: [
        { role: 'system', content: 'Answer in French.' },
        { role: 'user', content: 'second question' },
      ],
    });
    expect(seen(requests)).toEqual([
      [
        { role: 'system', text: 'Be brief.\n\nThe user is called Ada.\n\nAnswer in French.' },
        { role: 'user', text: 'first question' },
        { role: 'assistant', text: 'first answer' },
        { role: 'user', text: 'second question' },
      ],
    ]);
    expect(result.text).toBe('answer 1');
    // The history is context, not part of the run: its messages are the prompt and the answer.
    expect(result.messages).toMatchObject([
      { role: 'user', content: 'second question' },
      { role: 'assistant', content: [{ type: 'text', text: 'answer 1' }] },
    ]);
    expect(result.messages).toHaveLength(2);
    expect(result.usage.requests).toBe(1);
  });

  it('sends every message of a prompt list in order, an assistant one as an answer of the agent model', async () => {
    const { agent, requests } = await recordingAgent();
    const prompt: ChatMessage[] = [
      { role: 'user', content: 'one' },
      { role: 'assistant', content: 'two' },
      { role: 'user', content: 'three' },
    ];
    const result = await agent.run({ prompt });
    expect(seen(requests)[0]).toEqual([
      { role: 'user', text: 'one' },
      { role: 'assistant', text: 'two' },
      { role: 'user', text: 'three' },
    ]);
    expect(result.messages).toHaveLength(4);
    expect(result.messages[1]).toMatchObject({
      role: 'assistant',
      content: [{ type: 'text', text: 'two' }],
      api: 'openai-completions',
      provider: 'stand-in',
      model: 'stand-in-1',
      stopReason: 'stop',
      usage: { totalTokens: 0 },
    });
    expect(result.text).toBe('answer 1');
    expect(result.usage.requests).toBe(1);
  });

  it('with no instructions, the system prompt is the system texts alone', async () => {
    const { agent, requests } = await recordingAgent();
    await agent.run({
      prompt: [
        { role: 'system', content: 'Rule one.' },
        { role: 'user', content: 'hi' },
      ],
    });
    expect(seen(requests)[0]).toEqual([
      { role: 'system', text: 'Rule one.' },
      { role: 'user', text: 'hi' },
    ]);
  });

  it('works on the Anthropic protocol too, the system texts in its system prompt', async () => {
    const requests: StandInRequest[] = [];
    const p = await f.provider({
      reply: (r) => {
        requests.push(r);
        return { text: 'ok' };
      },
    });
    const agent = createAgent({
      model: f.model(p, 'anthropic-messages'),
      credentials: f.credentials,
      instructions: 'Be brief.',
      clock: f.clock,
    });
    await agent.run({
      history: [
        { role: 'user', content: 'q1' },
        { role: 'assistant', content: 'a1' },
      ],
      prompt: [
        { role: 'system', content: 'Extra rule.' },
        { role: 'user', content: 'q2' },
      ],
    });
    expect(seen(requests)[0]).toEqual([
      { role: 'system', text: 'Be brief.\n\nExtra rule.' },
      { role: 'user', text: 'q1' },
      { role: 'assistant', text: 'a1' },
      { role: 'user', text: 'q2' },
    ]);
  });
});

describe('bad prompt and history shapes', () => {
  it.each<[string, Record<string, unknown>, string]>([
    ['a number', { prompt: 42 }, 'Expected `prompt` to be a string or a list of messages, got `42`'],
    ['missing', {}, 'Expected `prompt` to be a string or a list of messages, got `undefined`'],
    [
      'an empty list',
      { prompt: [] },
      'Expected `prompt` to be a list with at least one user or assistant message, got `[]`',
    ],
    [
      'only system messages',
      { prompt: [{ role: 'system', content: 's' }] },
      'Expected `prompt` to be a list with at least one user or assistant message, got `[{"role":"system","content":"s"}]`',
    ],
    [
      'a bad role',
      {
        prompt: [
          { role: 'user', content: 'a' },
          { role: 'user', content: 'b' },
          { role: 'bot', content: 'c' },
        ],
      },
      'Expected `prompt[2].role` to be one of user, assistant, system, got `"bot"`',
    ],
    [
      'a content that is neither a string nor a list of parts',
      { prompt: [{ role: 'user', content: { type: 'text', text: 'x' } }] },
      'Expected `prompt[0].content` to be a string or a list of parts, got `{"type":"text","text":"x"}`',
    ],
    [
      'a message that is not an object',
      { prompt: ['hi'] },
      'Expected `prompt[0]` to be a message, got `"hi"`',
    ],
    [
      'history not a list',
      { prompt: 'hi', history: 'earlier' },
      'Expected `history` to be a list of messages, got `"earlier"`',
    ],
    [
      'a history message without a role',
      { prompt: 'hi', history: [{ role: 'user', content: 'a' }, { content: 'b' }] },
      'Expected `history[1].role` to be one of user, assistant, system, got `undefined`',
    ],
    [
      'a history message without content',
      { prompt: 'hi', history: [{ role: 'assistant' }] },
      'Expected `history[0].content` to be a string or a list of parts, got `undefined`',
    ],
  ])('refuses %s with a TypeError naming the field, before any request', async (_, options, message) => {
    const requests: StandInRequest[] = [];
    const p = await f.provider({
      reply: (r) => {
        requests.push(r);
        return { text: 'ok' };
      },
    });
    const agent = createAgent({ model: f.model(p), credentials: f.credentials, clock: f.clock });
    const error = await agent.run(options as never).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(TypeError);
    expect((error as Error).message).toBe(message);
    expect(requests).toEqual([]);
  });

  it('a history of system messages alone is fine: the prompt carries the question', async () => {
    const { agent, requests } = await recordingAgent();
    await agent.run({ history: [{ role: 'system', content: 'Context.' }], prompt: 'hi' });
    expect(seen(requests)[0]).toEqual([
      { role: 'system', text: 'Context.' },
      { role: 'user', text: 'hi' },
    ]);
  });
});
