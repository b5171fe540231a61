// A client nobody here wrote: the official `openai` npm package drives /v1/completions and
// /v1/chat/completions (plain and streamed) of a service started by launch/serve.sh.
//
//   HYSERVE_BUILD_DIR=build node tests/openai_client/openai_client_test.mjs
//
// The service runs the bamba-tiny checkpoint with the 512-token test tokenizer and ChatML on a
// free port. Every wait is bounded; the service is stopped at the end, also on failure.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import OpenAI from 'openai';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const STARTUP_LIMIT_MS = 600_000;  // serve.sh may have to configure and build first
const TOTAL_LIMIT_MS = 900_000;

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// PIDs of processes whose command line names `needle` (the ranks mpirun started: each runs in
// its own process group, so a group kill of serve.sh does not reach them).
function pidsWith(needle) {
  const out = [];
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    try {
      const cmd = fs.readFileSync(`/proc/${entry}/cmdline`, 'utf8');
      if (cmd.includes(needle)) out.push(Number(entry));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

class Service {
  constructor(port) {
    this.port = port;
    this.dir = fs.mkdtempSync(path.join(os.tmpdir(), 'hyserve-openai-'));
    this.config = path.join(this.dir, 'config.yaml');
    this.logPath = path.join(this.dir, 'serve.log');
    fs.writeFileSync(this.config, `model: {path: ${ROOT}/tests/fixtures/bamba-tiny, tokenizer: ${ROOT}/tests/fixtures/tokenizer-bpe512}
parallel: {tp: 1, dp: 1}
cache: {page_size: 16, max_requests: 8, max_context: 512}
server: {host: 127.0.0.1, port: ${port}}
chat:
  template: "<|im_start|>{role}\\n{content}<|im_end|>\\n"
  generation_prompt: "<|im_start|>assistant\\n"
  eos: "<|im_end|>"
`);
    this.exited = null;
  }

  start() {
    const log = fs.openSync(this.logPath, 'w');
    this.child = spawn(path.join(ROOT, 'launch/serve.sh'), [this.config], {
      cwd: ROOT,
      detached: true,  // its own process group, stopped as a whole
      stdio: ['ignore', log, log],
      env: { ...process.env, OMP_NUM_THREADS: '1' },
    });
    this.child.on('exit', (code, signal) => { this.exited = { code, signal }; });
  }

  log() {
    try { return fs.readFileSync(this.logPath, 'utf8'); } catch { return ''; }
  }

  async waitHealthy() {
    const until = Date.now() + STARTUP_LIMIT_MS;
    while (Date.now() < until) {
      if (this.exited) throw new Error(`serve.sh exited before serving (${JSON.stringify(this.exited)}):\n${this.log().slice(-4000)}`);
      try {
        const res = await fetch(`http://127.0.0.1:${this.port}/health`, { signal: AbortSignal.timeout(2000) });
        if (res.status === 200) return;
      } catch {
        // not listening yet
      }
      await sleep(250);
    }
    throw new Error(`no healthy service within ${STARTUP_LIMIT_MS / 1000} s:\n${this.log().slice(-4000)}`);
  }

  async stop() {
    if (!this.child) return;
    const group = -this.child.pid;
    try { process.kill(group, 'SIGTERM'); } catch { /* already gone */ }
    const until = Date.now() + 30_000;
    while (!this.exited && Date.now() < until) await sleep(100);
    if (!this.exited) {
      console.error('serve.sh did not stop within 30 s after SIGTERM: killing it');
      try { process.kill(group, 'SIGKILL'); } catch { /* gone */ }
    }
    // Ranks left behind (should not happen): found by this instance's config path.
    const left = Date.now() + 10_000;
    for (let pids = pidsWith(this.config); pids.length > 0 && Date.now() < left; pids = pidsWith(this.config)) {
      for (const pid of pids) { try { process.kill(pid, 'SIGKILL'); } catch { /* gone */ } }
      await sleep(100);
    }
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

function printableAsciiPair(text, from) {
  for (let i = from; i + 1 < text.length; ++i) {
    const pair = text.slice(i, i + 2);
    if (/^[\x21-\x7e]{2}$/.test(pair) && text.indexOf(pair) === i) return { pair, at: i };
  }
  return null;
}

// A delta is whole characters: no lone surrogate (what a split character would decode to on
// the client side), so it round-trips through UTF-8 unchanged.
function isValidUtf8Text(s) {
  return Buffer.from(s, 'utf8').toString('utf8') === s;
}

async function run(client, model) {
  // /v1/models
  const models = await client.models.list();
  assert.ok(models.data.length >= 1, 'models.list returned nothing');
  assert.equal(models.data[0].id, model);

  // /v1/completions, plain.
  const prompt = 'Once upon a time';
  const plain = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0 });
  assert.equal(plain.object, 'text_completion');
  assert.equal(plain.choices.length, 1);
  const text = plain.choices[0].text;
  assert.equal(typeof text, 'string');
  assert.ok(['stop', 'length'].includes(plain.choices[0].finish_reason), plain.choices[0].finish_reason);
  assert.ok(plain.usage.prompt_tokens > 0);
  assert.ok(plain.usage.completion_tokens > 0 && plain.usage.completion_tokens <= 24);
  assert.equal(plain.usage.total_tokens, plain.usage.prompt_tokens + plain.usage.completion_tokens);
  console.log(`completions: ${JSON.stringify(text)} (${plain.usage.completion_tokens} tokens)`);

  // /v1/completions, streamed: the same text.
  let streamed = '';
  let finish = null;
  for await (const chunk of await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0, stream: true })) {
    assert.equal(chunk.object, 'text_completion');
    streamed += chunk.choices[0].text;
    assert.ok(isValidUtf8Text(chunk.choices[0].text));
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.equal(streamed, text);
  assert.equal(finish, plain.choices[0].finish_reason);

  // A stop string: the answer ends right before it.
  const cut = printableAsciiPair(text, 2);
  if (cut) {
    const stopped = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0, stop: ['\u0001', cut.pair] });
    assert.equal(stopped.choices[0].text, text.slice(0, cut.at), `stop ${JSON.stringify(cut.pair)}`);
    assert.equal(stopped.choices[0].finish_reason, 'stop');
  } else {
    console.log('completions: no printable pair to use as a stop string; skipped that check');
  }

  // /v1/chat/completions, plain.
  const messages = [
    { role: 'system', content: 'You are terse.' },
    { role: 'user', content: 'Name a colour \u{1F3A8} please.' },
  ];
  const chat = await client.chat.completions.create({ model, messages, max_tokens: 32, temperature: 0, seed: 1 });
  assert.equal(chat.object, 'chat.completion');
  assert.ok(chat.id.startsWith('chatcmpl-'));
  const message = chat.choices[0].message;
  assert.equal(message.role, 'assistant');
  assert.equal(typeof message.content, 'string');
  assert.ok(['stop', 'length'].includes(chat.choices[0].finish_reason));
  assert.equal(chat.usage.total_tokens, chat.usage.prompt_tokens + chat.usage.completion_tokens);
  assert.ok(chat.usage.completion_tokens <= 32);
  console.log(`chat: ${JSON.stringify(message.content)} (${chat.usage.completion_tokens} tokens)`);

  // Streamed chat: role first, then content deltas that join to the same answer.
  let role = null;
  let content = '';
  let chatFinish = null;
  let chunks = 0;
  const stream = await client.chat.completions.create({ model, messages, max_tokens: 32, temperature: 0, seed: 1, stream: true });
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    const choice = chunk.choices[0];
    if (chunks++ === 0) role = choice.delta.role;
    if (choice.delta.content) {
      assert.ok(isValidUtf8Text(choice.delta.content));
      content += choice.delta.content;
    }
    if (choice.finish_reason) chatFinish = choice.finish_reason;
  }
  assert.equal(role, 'assistant');
  assert.equal(content, message.content);
  assert.equal(chatFinish, chat.choices[0].finish_reason);

  // Chat with a stop string taken from the answer.
  const chatCut = printableAsciiPair(message.content, 1);
  if (chatCut) {
    const stoppedChat = await client.chat.completions.create({ model, messages, max_tokens: 32, temperature: 0, seed: 1, stop: chatCut.pair });
    assert.equal(stoppedChat.choices[0].message.content, message.content.slice(0, chatCut.at));
    assert.equal(stoppedChat.choices[0].finish_reason, 'stop');
  }

  // A bad request is the client's BadRequestError (HTTP 400).
  await assert.rejects(
    client.chat.completions.create({ model, messages: [], max_tokens: 4 }),
    (err) => err instanceof OpenAI.BadRequestError && err.status === 400,
  );
}

async function main() {
  const port = await freePort();
  const service = new Service(port);
  let failed = false;
  const watchdog = setTimeout(async () => {
    console.error(`FAIL: the test did not finish within ${TOTAL_LIMIT_MS / 1000} s`);
    await service.stop();
    process.exit(1);
  }, TOTAL_LIMIT_MS);
  try {
    service.start();
    await service.waitHealthy();
    const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'not-needed', timeout: 120_000, maxRetries: 0 });
    const model = (await client.models.list()).data[0].id;
    await run(client, model);
    console.log('PASS: openai client against launch/serve.sh');
  } catch (err) {
    failed = true;
    console.error('FAIL:', err?.stack ?? err);
    console.error('---- serve.sh log tail ----\n' + service.log().slice(-3000));
  } finally {
    await service.stop();
    clearTimeout(watchdog);
  }
  process.exit(failed ? 1 : 0);
}

main();
