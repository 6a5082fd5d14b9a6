// A WHEP player page built on medooze's whip-whep client (npm, pinned in package-lock.json), for rtvoice's browser
// test and benchmark. It is served from another origin than the server, so every WHEP request is cross-origin.
// window.whepTest drives it from Playwright:
//   await whepTest.connect({server, datachannel, playAtSpeak}) -> the WHEP session is up (and the "tts" DataChannel)
//   await whepTest.speak({via: "speak" | "datachannel", text}) -> sends the text; returns once it is audible
//   await whepTest.waitQuiet(), whepTest.heard(), whepTest.stats() -> the end of the utterance, what was heard, getStats
//   whepTest.record(), await whepTest.recorded() -> what the page rendered in between: {rate, pcm (base64 int16 LE)}
//   whepTest.negotiated() -> whether the answer has RED and Opus in-band FEC
// The track plays in an <audio> element, as a player's would. Speech is audible when a WebAudio render quantum of the
// received track rises above -40 dBFS RMS (an AudioWorklet, onset.js). playAtSpeak starts playback only with the
// first text, like a player whose user presses play: whatever the browser received before then waits in its
// jitter buffer.
import { WHEPClient } from "./node_modules/whip-whep/whep.js";

const AUDIBLE_RMS = 0.01;
const STATS_FIELDS = [
  "packetsReceived", "packetsLost", "jitter", "jitterBufferDelay", "jitterBufferTargetDelay",
  "jitterBufferMinimumDelay", "jitterBufferEmittedCount", "totalSamplesReceived", "concealedSamples",
  "silentConcealedSamples", "concealmentEvents", "insertedSamplesForDeceleration", "removedSamplesForAcceleration",
  "totalAudioEnergy", "totalSamplesDuration", "audioLevel", "lastPacketReceivedTimestamp",
  "fecPacketsReceived", "fecPacketsDiscarded", "packetsDiscarded",
];

const state = {
  pc: null, client: null, channel: null, events: [], errors: [], context: null, onset: null,
  armedAt: null, onsetAt: null, resolveOnset: null, resolveReport: null, resolveRecording: null, pendingStream: null,
  connectedAt: null,
};

function contextToPerformance(contextTime) {
  // The AudioContext clock and performance.now(), related through the context's own output timestamp.
  const stamp = state.context.getOutputTimestamp();
  return stamp.performanceTime + (contextTime - stamp.contextTime) * 1000;
}

async function inboundAudio() {
  if (!state.pc) return null;
  const report = await state.pc.getStats();
  let found = null;
  report.forEach((s) => { if (s.type === "inbound-rtp" && s.kind === "audio") found = s; });
  if (!found) return null;
  const picked = { at: performance.now() };
  for (const field of STATS_FIELDS) picked[field] = found[field] ?? null;
  return picked;
}

async function listen(stream) {
  document.getElementById("player").srcObject = stream;  // Chrome feeds remote audio to WebAudio only while played
  state.context = new AudioContext();
  await state.context.audioWorklet.addModule("./onset.js");
  state.onset = new AudioWorkletNode(state.context, "onset");
  state.onset.port.onmessage = (message) => {
    if (message.data.type === "onset" && state.armedAt !== null && state.onsetAt === null) {
      state.onsetAt = Math.max(state.armedAt, contextToPerformance(message.data.contextTime));
      if (state.resolveOnset) state.resolveOnset();
    } else if (message.data.type === "report" && state.resolveReport) {
      state.resolveReport(message.data);
    } else if (message.data.type === "recorded" && state.resolveRecording) {
      state.resolveRecording(message.data.samples);
    }
  };
  state.context.createMediaStreamSource(stream).connect(state.onset);
  if (state.context.state === "suspended") await state.context.resume();
}

function until(predicate, timeoutMs, what) {
  return new Promise((resolve, reject) => {
    const started = performance.now();
    const poll = () => {
      if (predicate()) return resolve();
      if (performance.now() - started > timeoutMs) return reject(new Error(`timed out waiting for ${what}`));
      setTimeout(poll, 5);
    };
    poll();
  });
}

// jitterBufferTargetMs: ask the receiver for that much jitter buffer (RTCRtpReceiver.jitterBufferTarget), as a
// player on a link with jitter would get; none: the browser's own choice.
async function connect({
  server, datachannel = true, voice = null, token = null, playAtSpeak = false, jitterBufferTargetMs = null,
}) {
  const pc = new RTCPeerConnection();
  state.pc = pc;
  pc.addTransceiver("audio", { direction: "recvonly" });
  let listening = null;
  pc.ontrack = (event) => {
    if (jitterBufferTargetMs !== null) event.receiver.jitterBufferTarget = jitterBufferTargetMs;
    const stream = event.streams[0] || new MediaStream([event.track]);
    if (playAtSpeak) { state.pendingStream = stream; listening = Promise.resolve(); }
    else listening = listen(stream);
  };
  if (datachannel) {
    state.channel = pc.createDataChannel("tts");
    state.channel.onmessage = (message) => {
      const parsed = JSON.parse(message.data);
      parsed.receivedAt = performance.now();
      state.events.push(parsed);
    };
  }
  state.client = new WHEPClient();
  const url = new URL("/whep", server);
  if (voice) url.searchParams.set("voice", voice);
  await state.client.view(pc, url.toString(), token);
  await until(() => pc.connectionState === "connected", 20000, "the peer connection");
  state.connectedAt = performance.now();
  if (state.channel) await until(() => state.channel.readyState === "open", 20000, "the DataChannel");
  await until(() => listening !== null, 20000, "the audio track");
  await listening;
  return { resource: state.client.resourceURL.toString(), origin: location.origin };
}

async function speak({ via, text, requestId = null, seed = null, timeoutMs = 20000 }) {
  if (state.pendingStream) { await listen(state.pendingStream); state.pendingStream = null; }
  state.onsetAt = null;
  const before = await inboundAudio();
  const onset = new Promise((resolve) => { state.resolveOnset = resolve; });
  state.onset.port.postMessage({ type: "arm", threshold: AUDIBLE_RMS });
  const sentAt = performance.now();
  state.armedAt = sentAt;
  let response = null;
  if (via === "speak") {
    const reply = await fetch(new URL("speak", state.client.resourceURL.toString() + "/"), {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ text, request_id: requestId, seed }),
    });
    response = { status: reply.status, body: await reply.json(), answeredMs: performance.now() - sentAt };
  } else {
    state.channel.send(JSON.stringify({ type: "tts_request", text, request_id: requestId, seed }));
  }
  const timeout = new Promise((resolve) => setTimeout(resolve, timeoutMs));
  await Promise.race([onset, timeout]);
  if (state.onsetAt === null) throw new Error(`no audible frame within ${timeoutMs} ms`);
  return {
    sentAt, response,
    firstAudibleMs: state.onsetAt - sentAt,
    before, at: await inboundAudio(),
  };
}

// Resolves once the received audio has been quiet (getStats audioLevel) for quietMs: the utterance has ended.
async function waitQuiet({ quietMs = 400, timeoutMs = 30000 } = {}) {
  const started = performance.now();
  let quietSince = null;
  while (performance.now() - started < timeoutMs) {
    const stats = await inboundAudio();
    const now = performance.now();
    if ((stats?.audioLevel || 0) > AUDIBLE_RMS) quietSince = null;
    else if (quietSince === null) quietSince = now;
    else if (now - quietSince >= quietMs) return stats;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  throw new Error(`audio still playing after ${timeoutMs} ms`);
}

// What the player heard since the last arm: energy (sum of squares), samples, peak.
function heard() {
  const report = new Promise((resolve) => { state.resolveReport = resolve; });
  state.onset.port.postMessage({ type: "report" });
  return report;
}

function record() {
  state.onset.port.postMessage({ type: "record" });
}

// What the worklet rendered since record(), as 16-bit PCM in base64 (one string crosses to Playwright cheaply).
async function recorded() {
  const samples = await new Promise((resolve) => {
    state.resolveRecording = resolve;
    state.onset.port.postMessage({ type: "stop" });
  });
  const pcm = new Int16Array(samples.length);
  for (let i = 0; i < samples.length; i++) pcm[i] = Math.max(-32768, Math.min(32767, Math.round(samples[i] * 32767)));
  const bytes = new Uint8Array(pcm.buffer);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return { rate: state.context.sampleRate, pcm: btoa(binary) };
}

function negotiated() {
  const sdp = state.pc?.remoteDescription?.sdp || "";
  return { red: /a=rtpmap:\d+ red\/48000\/2/i.test(sdp), fec: /useinbandfec=1/.test(sdp) };
}

async function close() {
  if (state.client) await state.client.stop().catch(() => {});
  if (state.context) await state.context.close();
}

window.whepTest = {
  connect, speak, waitQuiet, heard, stats: inboundAudio, record, recorded, negotiated, close, state,
};
window.whepTestReady = true;
