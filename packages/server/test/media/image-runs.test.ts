import OpenAI from 'openai';
import { createAgent } from 'sluice';
import { beforeAll, describe, expect, it } from 'vitest';
import { startProviderStandIn, type ProviderStandIn } from '@sluice/testkit';
import { freshDatabase, ownStandIn, startTestServer, until, type TestServer } from '../helpers.js';
import { PNG, sha256, upload } from './upload-client.js';

// Image runs end to end: a client sends an image (an uploaded file's id or a data: URL) on the
// runs API, /responses or /chat/completions; the stand-in provider reports the image bytes it
// was sent (its default reply notes each image: ` [image image/png, 68 bytes]`).

const dataUrl = `data:image/png;base64,${PNG.toString('base64')}`;
const note = ` [image image/png, ${PNG.length} bytes]`;

/** The images the provider's last request carried, as size and SHA-256. */
const lastImages = (provider: ProviderStandIn) =>
  provider.requests.at(-1)!.images.map((i) => ({ mimeType: i.mimeType, bytes: i.bytes, sha256: i.sha256 }));
const thePng = { mimeType: 'image/png', bytes: PNG.length, sha256: sha256(PNG) };

async function serverWithImages(
  options: { database?: 'postgres' | 'pglite'; databaseUrl?: string; background?: boolean } = {},
) {
  const provider = ownStandIn(await startProviderStandIn());
  return startTestServer({
    ...options,
    provider,
    tenants: { capped: { runs: { limit: 1, per: 'hour' } } },
    // An agent whose model reads text only.
    agents: (model) => ({
      blind: createAgent({ model: { ...model, input: ['text'] }, credentials: { apiKey: 'k' } }),
    }),
  });
}

const runsOf = async (t: TestServer, token: string) =>
  (await t.call('GET', '/agents/runs', undefined, token)).body.data as unknown[];

describe('image runs on PostgreSQL', () => {
  let t: TestServer;
  let openai: OpenAI;
  beforeAll(async () => {
    t = await serverWithImages({ database: 'postgres' });
    openai = new OpenAI({ baseURL: `${t.server.url}/api/client/v1`, apiKey: t.admin, maxRetries: 0 });
  });

  it('the runs API takes input messages with an uploaded file: the provider gets its bytes', async () => {
    const file = await upload(t.server.url, t.admin, PNG);
    const r = await t.call('POST', '/agents/echo/runs', {
      input: [
        {
          type: 'message',
          role: 'user',
          content: [
            { type: 'input_text', text: 'what is this?' },
            { type: 'input_image', file_id: file.body.id },
          ],
        },
      ],
    });
    expect(r.status).toBe(200);
    expect(r.body).toMatchObject({ status: 'succeeded', output: { text: `Echo: what is this?${note}` } });
    expect(lastImages(t.provider)).toEqual([thePng]);
    // The run keeps the reference, not the bytes.
    expect(r.body.input[0].content[1]).toEqual({ type: 'input_image', file_id: file.body.id });
  });

  it('the runs API takes a data: URL in `messages`', async () => {
    const r = await t.call('POST', '/agents/echo/runs', {
      messages: [
        {
          role: 'user',
          content: [
            { type: 'text', text: 'and this?' },
            { type: 'input_image', image_url: dataUrl },
          ],
        },
      ],
    });
    expect(r.body).toMatchObject({ status: 'succeeded', output: { text: `Echo: and this?${note}` } });
    expect(lastImages(t.provider)).toEqual([thePng]);
  });

  it('/responses with the official openai client: an input_image by file id reaches the provider', async () => {
    const file = await upload(t.server.url, t.admin, PNG);
    const response = await openai.responses.create({
      model: 'agent:echo',
      input: [
        {
          role: 'user',
          content: [
            { type: 'input_text', text: 'describe' },
            { type: 'input_image', file_id: String(file.body.id), detail: 'auto' },
          ],
        },
      ],
    });
    expect(response.status).toBe('completed');
    expect(response.output_text).toBe(`Echo: describe${note}`);
    expect(lastImages(t.provider)).toEqual([thePng]);
  });

  it('/chat/completions with the official openai client: an image_url data: URL reaches the provider', async () => {
    const completion = await openai.chat.completions.create({
      model: 'agent:echo',
      messages: [
        {
          role: 'user',
          content: [
            { type: 'text', text: 'look' },
            { type: 'image_url', image_url: { url: dataUrl } },
          ],
        },
      ],
    });
    expect(completion.choices[0]!.message.content).toBe(`Echo: look${note}`);
    expect(lastImages(t.provider)).toEqual([thePng]);
  });

  it('a remote image URL is refused naming the field, on every front, and makes no run', async () => {
    const { token } = { token: await t.token({ tenant: 'remote' }) };
    const client = new OpenAI({ baseURL: `${t.server.url}/api/client/v1`, apiKey: token, maxRetries: 0 });
    const remote = 'http://169.254.169.254/latest/meta-data/x.png';
    await expect(
      client.chat.completions.create({
        model: 'agent:echo',
        messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: remote } }] }],
      }),
    ).rejects.toMatchObject({ status: 400, param: 'messages.0.content.0.image_url.url' });
    await expect(
      client.responses.create({
        model: 'agent:echo',
        input: [{ role: 'user', content: [{ type: 'input_image', image_url: remote, detail: 'auto' }] }],
      }),
    ).rejects.toMatchObject({ status: 400, param: 'input.0.content.0.image_url' });
    const runs = await t.call(
      'POST',
      '/agents/echo/runs',
      { input: [{ role: 'user', content: [{ type: 'input_image', image_url: remote }] }] },
      token,
    );
    expect(runs.status).toBe(400);
    expect(runs.body.error).toMatchObject({ field: 'input.0.content.0.image_url' });
    expect(runs.body.error.message).toMatch(/fetches no URL/);
    expect(await runsOf(t, token)).toHaveLength(0);
  });

  it("another tenant's file in a run is 404 and admits nothing: no run row, no quota used", async () => {
    const file = await upload(t.server.url, t.admin, PNG);
    const capped = await t.token({ tenant: 'capped' });
    const image = { type: 'input_image', file_id: file.body.id };
    const r = await t.call(
      'POST',
      '/agents/echo/runs',
      { input: [{ role: 'user', content: [image] }] },
      capped,
    );
    expect(r.status).toBe(404);
    expect(r.body.error).toMatchObject({ type: 'not_found', field: 'input.0.content.0.file_id' });
    const client = new OpenAI({ baseURL: `${t.server.url}/api/client/v1`, apiKey: capped, maxRetries: 0 });
    await expect(
      client.responses.create({
        model: 'agent:echo',
        input: [{ role: 'user', content: [{ ...image, detail: 'auto' } as never] }],
      }),
    ).rejects.toBeInstanceOf(OpenAI.NotFoundError);
    expect(await runsOf(t, capped)).toHaveLength(0);
    // The tenant's one run of the hour is still there to use.
    expect((await t.call('POST', '/agents/echo/runs', { input: 'hi' }, capped)).status).toBe(200);
  });

  it('an image for a text-only model, or in an assistant message, is 400 naming the part', async () => {
    const token = await t.token({ tenant: 'blind' });
    const image = { type: 'input_image', image_url: dataUrl };
    const blind = await t.call(
      'POST',
      '/agents/blind/runs',
      { input: [{ role: 'user', content: [image] }] },
      token,
    );
    expect(blind.status).toBe(400);
    expect(blind.body.error).toMatchObject({ field: 'input.0.content.0' });
    expect(blind.body.error.message).toMatch(/takes text only/);
    const assistant = await t.call(
      'POST',
      '/agents/echo/runs',
      {
        input: [
          { role: 'assistant', content: [image] },
          { role: 'user', content: 'so?' },
        ],
      },
      token,
    );
    expect(assistant.status).toBe(400);
    expect(assistant.body.error.message).toMatch(/assistant message/);
    expect(await runsOf(t, token)).toHaveLength(0);
  });

  it('a data: URL that is not a base64 image is 400 naming it', async () => {
    for (const url of ['data:text/plain;base64,aGk=', 'data:image/png;base64,@@@', 'data:image/png,raw']) {
      const r = await t.call('POST', '/agents/echo/runs', {
        input: [{ role: 'user', content: [{ type: 'input_image', image_url: url }] }],
      });
      expect(r.status).toBe(400);
      expect(r.body.error.field).toBe('input.0.content.0.image_url');
    }
  });
});

describe('queued image runs', () => {
  it('keep their image across a restart: admitted by one process, run by the next, which reads the file', async () => {
    const databaseUrl = await freshDatabase();
    // The first process admits and runs nothing in the background, then stops.
    const first = await serverWithImages({ databaseUrl, background: false });
    const kept = await upload(first.server.url, first.admin, PNG);
    const deleted = await upload(first.server.url, first.admin, PNG);
    const queue = async (id: unknown, text: string) =>
      (
        await first.call('POST', '/agents/echo/runs', {
          class: 'deferred',
          input: [
            {
              role: 'user',
              content: [
                { type: 'text', text },
                { type: 'input_image', file_id: id },
              ],
            },
          ],
        })
      ).body;
    const keptRun = await queue(kept.body.id, 'kept');
    const deletedRun = await queue(deleted.body.id, 'deleted');
    expect([keptRun.status, deletedRun.status]).toEqual(['queued', 'queued']);
    expect((await first.call('DELETE', `/files/${deleted.body.id}`)).status).toBe(200);
    await first.server.close();

    const second = await serverWithImages({ databaseUrl });
    await until(async () => {
      const runs = await Promise.all([second.statusOf(keptRun.id), second.statusOf(deletedRun.id)]);
      return runs.every((r) => r.status === 'succeeded' || r.status === 'failed');
    }, 'both queued runs ended');
    expect(await second.statusOf(keptRun.id)).toMatchObject({
      status: 'succeeded',
      output: { text: `Echo: kept${note}` },
    });
    expect(second.provider.requests.flatMap((r) => r.images)).toEqual([thePng]);
    expect(await second.statusOf(deletedRun.id)).toMatchObject({
      status: 'failed',
      error: { message: `File ${deleted.body.id} was deleted before the run read it` },
    });
  });
});

describe('an image run on the embedded path (PGlite)', () => {
  it('uploads and runs with the file, as on PostgreSQL', async () => {
    const t = await serverWithImages({ database: 'pglite' });
    const file = await upload(t.server.url, t.admin, PNG);
    const r = await t.call('POST', '/agents/echo/runs', {
      input: [{ role: 'user', content: [{ type: 'input_image', file_id: file.body.id }] }],
    });
    expect(r.body).toMatchObject({ status: 'succeeded', output: { text: `Echo: ${note}` } });
    expect(lastImages(t.provider)).toEqual([thePng]);
  });
});
