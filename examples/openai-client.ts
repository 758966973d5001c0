/**
 * `npm run example:openai`: the official `openai` client talking to a Sluice run server, for
 * instance the demo of `npm start` (agents `writer` and `researcher`). A response is a run of an
 * agent: the client's `model` names the agent as `agent:NAME`.
 *
 *   SLUICE_TOKEN=<the token npm start printed> npm run example:openai
 *
 * SLUICE_URL defaults to http://127.0.0.1:8787. See docs/openai.md for the whole mapping.
 */
import { pathToFileURL } from 'node:url';
import OpenAI from 'openai';

export interface ExampleOptions {
  /** The server, e.g. `http://127.0.0.1:8787`. */
  url: string;
  /** A Sluice API token (role `member` or `admin`). */
  token: string;
  /** Where the output goes; default: standard output. */
  write?: (text: string) => void;
  /** Pause between two looks at a background response (ms). */
  pollMs?: number;
}

type Response = OpenAI.Responses.Response;

export interface ExampleResult {
  first: Response;
  streamed: { deltas: string[]; final: Response };
  followUp: Response;
  flex: { created: Response; final: Response };
  cancelled: Response;
  chat: OpenAI.Chat.ChatCompletion;
}

const ended = new Set(['completed', 'failed', 'cancelled', 'incomplete']);
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

export async function main(options: ExampleOptions): Promise<ExampleResult> {
  const write = options.write ?? ((text: string) => void process.stdout.write(text));
  const say = (line = '') => write(`${line}\n`);
  // Over a cap Sluice answers 429 with Retry-After (30 or 60 s): with its default retries the
  // client would sleep that out, twice. Here we would rather see the refusal at once.
  const client = new OpenAI({
    baseURL: `${options.url}/api/client/v1`,
    apiKey: options.token,
    maxRetries: 0,
  });

  say('1. A response (held until the run ends)');
  const first = await client.responses.create({ model: 'agent:writer', input: 'tides' });
  say(`   ${first.id}  ${first.status}  "${first.output_text}"`);
  say(`   usage: ${first.usage?.input_tokens} in + ${first.usage?.output_tokens} out tokens`);

  say('2. A streamed response, with the stream helper');
  write('   ');
  const deltas: string[] = [];
  const stream = client.responses.stream({ model: 'agent:writer', input: 'lighthouses' });
  stream.on('response.output_text.delta', (event) => {
    deltas.push(event.delta);
    write(event.delta);
  });
  const final = await stream.finalResponse();
  say(`\n   ${final.id}  ${final.status}  after ${deltas.length} text deltas`);

  say('3. A follow-up: previous_response_id continues the conversation, as a thread');
  const followUp = await client.responses.create({
    model: 'agent:writer',
    input: 'the moon',
    previous_response_id: first.id,
  });
  say(`   ${followUp.id}  ${followUp.status}  "${followUp.output_text}"`);
  const threads = await Promise.all(
    [first.id, followUp.id].map(async (id) => (await runOf(options, id))?.thread_id),
  );
  say(
    threads[0] === threads[1]
      ? `   in the runs API, both runs are on thread ${threads[0]}`
      : `   in the runs API, the runs are on threads ${threads.join(' and ')}`,
  );

  say("4. service_tier 'flex' (the deferred class), in the background, looked at until it ends");
  const created = await client.responses.create({
    model: 'agent:researcher',
    input: 'coral reefs',
    service_tier: 'flex',
    background: true,
  });
  say(`   ${created.id}  ${created.status}  service_tier ${created.service_tier}`);
  let flex = created;
  while (!ended.has(flex.status ?? '')) {
    await sleep(options.pollMs ?? 500);
    flex = await client.responses.retrieve(created.id);
  }
  const flexRun = await runOf(options, created.id);
  say(`   ${flex.id}  ${flex.status}  "${flex.output_text}"  (run class: ${String(flexRun?.class)})`);

  say('5. A background response, cancelled');
  const long = await client.responses.create({
    model: 'agent:writer',
    input: 'every ocean, in depth',
    background: true,
  });
  const cancelled = await client.responses.cancel(long.id);
  say(
    `   ${cancelled.id}  ${long.status} -> ${cancelled.status}` +
      (cancelled.status === 'completed' ? ' (it ended before the cancel came)' : ''),
  );

  say('6. A chat completion');
  const chat = await client.chat.completions.create({
    model: 'agent:researcher',
    messages: [{ role: 'user', content: 'volcanoes' }],
  });
  say(`   ${chat.id}  ${chat.choices[0]?.finish_reason}  "${chat.choices[0]?.message.content}"`);

  return { first, streamed: { deltas, final }, followUp, flex: { created, final: flex }, cancelled, chat };
}

/** The run behind a response, from Sluice's own runs API: the same id. */
async function runOf(
  options: ExampleOptions,
  id: string,
): Promise<{ class?: string; thread_id?: string | null } | undefined> {
  const reply = await fetch(`${options.url}/api/client/v1/agents/runs/${id}`, {
    headers: { authorization: `Bearer ${options.token}` },
  });
  return reply.ok ? ((await reply.json()) as { class?: string; thread_id?: string | null }) : undefined;
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const token = process.env.SLUICE_TOKEN;
  if (!token) {
    console.error(
      'Set SLUICE_TOKEN to a Sluice API token: `npm start` prints one the first time it runs ' +
        '(or stop it and run `npm run sluice -- tokens create --tenant local --project default --user me --role member`).',
    );
    process.exit(1);
  }
  main({ url: (process.env.SLUICE_URL ?? 'http://127.0.0.1:8787').replace(/\/+$/, ''), token }).catch(
    (error: unknown) => {
      console.error(error instanceof OpenAI.APIError ? `${error.status} ${error.message}` : error);
      process.exit(1);
    },
  );
}
