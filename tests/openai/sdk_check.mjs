// sdk_check.mjs — kvrelay through the official `openai` npm client, as a user
// would call it. Run by tests/proc/openai_sdk_test.cc against an engine and
// the router (`node sdk_check.mjs SDK_DIR BASE_URL MODEL LABEL`); prints one
// line per check and exits non-zero if any failed.
//
// What it checks: models.list(); a completion with and without streaming
// gives the same text once (the stream's chunks add up to it: no token
// twice); the last choice chunk carries finish_reason, then the usage chunk
// (stream_options.include_usage), then the end; an AbortController cancel
// mid-stream ends the stream early (the SDK ends its iteration quietly; a
// cancel before the response raises APIUserAbortError) and the server sees
// the client leave (the C++ side checks its counter); bad requests raise
// the SDK's APIError subclasses with the right status; 50 concurrent
// streams with 10 cancelled: 40 complete and correct, 10 cut short. The
// chat API: chat.completions.create with and without streaming gives one
// assistant message (the stream's deltas add up to it, the first naming the
// role), max_completion_tokens holds, and a bad role is a BadRequestError.
import { createRequire } from 'node:module';

const [sdkDir, baseUrl, model, label] = process.argv.slice(2);
const require = createRequire(sdkDir + '/');
const { OpenAI, APIError, APIUserAbortError, BadRequestError } = require('openai');

const client = new OpenAI({ apiKey: 'unused', baseURL: baseUrl + '/v1', maxRetries: 0,
                            timeout: 60_000 });
let failed = 0;
function check(name, ok, detail = '') {
  console.log(`${ok ? 'PASS' : 'FAIL'} [${label}] ${name}${detail ? ': ' + detail : ''}`);
  if (!ok) failed++;
}
async function expectError(name, fn, cls, status) {
  try {
    await fn();
    check(name, false, 'no error raised');
  } catch (e) {
    check(name, e instanceof cls && (status === undefined || e.status === status),
          `${e.constructor.name} status ${e.status}: ${e.message}`);
  }
}
const words = (n, seed) => Array.from({ length: n }, (_, i) => `w${(seed * 31 + i * 7) % 997}`).join(' ');

// Streams `prompt`; returns {text, chunks, finish, usage, afterUsage}.
async function streamed(prompt, maxTokens, signal) {
  const stream = await client.completions.create(
      { model, prompt, max_tokens: maxTokens, stream: true,
        stream_options: { include_usage: true } },
      { signal });
  let text = '', finish = null, usage = null, chunks = 0, orderOk = true;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.choices.length === 0) {
      if (chunk.usage) usage = chunk.usage;
      if (finish === null) orderOk = false;   // usage before the finish
      continue;
    }
    if (finish !== null || usage !== null) orderOk = false;   // a choice after the end
    text += chunk.choices[0].text;
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  return { text, chunks, finish, usage, orderOk };
}

async function main() {
  const models = await client.models.list();
  check('models.list() names the model', models.data.length === 1 && models.data[0].id === model,
        JSON.stringify(models.data.map((m) => m.id)));

  const prompt = words(40, 1);
  const whole = await client.completions.create({ model, prompt, max_tokens: 12 });
  check('a completion without streaming', whole.choices[0].finish_reason === 'length' &&
        whole.usage.completion_tokens === 12 && whole.choices[0].text.length > 0,
        JSON.stringify(whole.usage));
  const s = await streamed(prompt, 12);
  check('a stream adds up to the same text, once', s.text === whole.choices[0].text,
        `${JSON.stringify(s.text)} vs ${JSON.stringify(whole.choices[0].text)}`);
  check('the last choice chunk has finish_reason, then usage, then the end',
        s.finish === 'length' && s.orderOk && s.usage !== null &&
        s.usage.completion_tokens === 12 && s.usage.prompt_tokens === whole.usage.prompt_tokens,
        JSON.stringify(s.usage));

  // The chat API.
  const messages = [{ role: 'system', content: 'be brief' },
                    { role: 'user', content: words(30, 5) }];
  const chat = await client.chat.completions.create(
      { model, messages, max_completion_tokens: 10 });
  const reply = chat.choices[0];
  check('a chat without streaming is one assistant message',
        chat.object === 'chat.completion' && reply.message.role === 'assistant' &&
        typeof reply.message.content === 'string' && reply.message.content.length > 0 &&
        reply.finish_reason === 'length' && chat.usage.completion_tokens === 10,
        JSON.stringify(reply));
  {
    const stream = await client.chat.completions.create(
        { model, messages, max_completion_tokens: 10, stream: true,
          stream_options: { include_usage: true } });
    let content = '', role = null, finish = null, usage = null, n = 0;
    for await (const chunk of stream) {
      if (chunk.choices.length === 0) { usage = chunk.usage; continue; }
      const delta = chunk.choices[0].delta;
      if (n++ === 0) role = delta.role;
      content += delta.content ?? '';
      finish = chunk.choices[0].finish_reason ?? finish;
    }
    check('a streamed chat adds up to the same message, the first delta naming the role',
          content === reply.message.content && role === 'assistant' && finish === 'length' &&
          usage?.completion_tokens === 10,
          `${JSON.stringify(content)} vs ${JSON.stringify(reply.message.content)}, role ${role}`);
  }
  await expectError('a chat with an unknown role is a BadRequestError (400)',
      () => client.chat.completions.create(
          { model, messages: [{ role: 'robot', content: 'hi' }], max_tokens: 2 }),
      BadRequestError, 400);

  // An AbortController cancel mid-stream: the iteration ends early, with no
  // finish_reason.
  {
    const ac = new AbortController();
    let got = 0, finish = null, error = null;
    try {
      const stream = await client.completions.create(
          { model, prompt: words(30, 2), max_tokens: 900, stream: true }, { signal: ac.signal });
      for await (const chunk of stream) {
        got++;
        finish = chunk.choices[0]?.finish_reason ?? finish;
        if (got === 2) ac.abort();
      }
    } catch (e) {
      error = e;
    }
    check('an AbortController cancel mid-stream ends it early',
          (error === null || error instanceof APIUserAbortError) && finish === null && got < 100,
          `${got} chunks, finish ${finish}, ${error?.constructor?.name ?? 'no error'}`);
  }
  // A cancel before the response: APIUserAbortError.
  await expectError('a cancel before the response raises APIUserAbortError', async () => {
    const ac = new AbortController();
    const p = client.completions.create(
        { model, prompt: words(30, 4), max_tokens: 900, stream: true }, { signal: ac.signal });
    ac.abort();
    for await (const _ of await p) {}
  }, APIUserAbortError);

  await expectError('max_tokens 0 is a BadRequestError (400)',
      () => client.completions.create({ model, prompt, max_tokens: 0 }), BadRequestError, 400);
  await expectError('another model is a 4xx APIError',
      () => client.completions.create({ model: 'no-such-model', prompt, max_tokens: 2 }),
      APIError);
  await expectError('a body over --max-body-bytes is an APIError 413',
      () => client.completions.create({ model, prompt: words(300_000, 3), max_tokens: 2 }),
      APIError, 413);
  await expectError('a stream refused up front raises before its first chunk',
      async () => { for await (const _ of await client.completions.create(
          { model, prompt, max_tokens: -1, stream: true })) {} },
      BadRequestError, 400);

  // 50 streams at once, 10 of them aborted after their first chunk.
  const results = await Promise.allSettled(Array.from({ length: 50 }, async (_, i) => {
    const ac = new AbortController();
    const p = words(20 + i, 100 + i);
    const stream = await client.completions.create(
        { model, prompt: p, max_tokens: i < 10 ? 900 : 16, stream: true,
          stream_options: { include_usage: true } }, { signal: ac.signal });
    let text = '', finish = null, usage = null;
    for await (const chunk of stream) {
      if (i < 10) ac.abort();   // after the first chunk
      if (chunk.choices.length) {
        text += chunk.choices[0].text;
        finish = chunk.choices[0].finish_reason ?? finish;
      } else {
        usage = chunk.usage;
      }
    }
    return { i, text, finish, usage, prompt: p };
  }));
  const aborted = results.filter((r, i) => i < 10 &&
      ((r.status === 'fulfilled' && r.value.finish === null && r.value.usage === null) ||
       (r.status === 'rejected' && r.reason instanceof APIUserAbortError))).length;
  const done = results.filter((r, i) => i >= 10 && r.status === 'fulfilled' &&
                                        r.value.finish === 'length' &&
                                        r.value.usage?.completion_tokens === 16).length;
  check('50 concurrent streams: the 10 cancelled are cut short', aborted === 10, `${aborted}`);
  check('50 concurrent streams: the other 40 complete', done === 40,
        results.filter((r) => r.status === 'rejected').map((r) => String(r.reason)).slice(0, 3)
            .join('; '));
  // Each completed stream's text is the model's: the same prompt, not streamed.
  let same = 0;
  for (const r of results.slice(10)) {
    if (r.status !== 'fulfilled') continue;
    const w = await client.completions.create({ model, prompt: r.value.prompt, max_tokens: 16 });
    if (w.choices[0].text === r.value.text) same++;
  }
  check('their texts equal the non-streamed completions', same === 40, `${same} of 40`);
}

main().then(() => {
  console.log(`${failed === 0 ? 'OK' : 'FAILED'} [${label}] ${failed} failed`);
  process.exit(failed === 0 ? 0 : 1);
}, (e) => {
  console.log(`FAIL [${label}] unexpected: ${e?.constructor?.name}: ${e?.message}`);
  process.exit(2);
});
