// rtvoice demo page: one text box, three transports (WHEP/WebRTC, WebSocket, HTTP), a TTFA readout and a level meter.
// No build step: plain browser JavaScript.
"use strict";

const $ = (id) => document.getElementById(id);

// What the page measured, for people (the readout) and for the browser test (window.rtvoice).
const stats = (window.rtvoice = {
  transport: null, requestSentAt: null, firstAudioAt: null, ttfaMs: null, maxLevel: 0,
  events: [], errors: [], whepConnected: false,
});

let audioContext = null;
let analyser = null;

function audio() {
  if (!audioContext) {
    audioContext = new AudioContext();
    analyser = audioContext.createAnalyser();
    analyser.fftSize = 1024;
    analyser.connect(audioContext.destination);
    meterLoop();
  }
  if (audioContext.state === "suspended") audioContext.resume();
  return audioContext;
}

function setState(text) { $("state").textContent = text; }

// ---- API key: asked for when the server answers 401; sent on every transport ------------------------------------

// The key lives in this tab only (sessionStorage), never in the page's URL.
function apiKey() { return $("api-key").value.trim(); }
function authHeaders() { return apiKey() ? { Authorization: `Bearer ${apiKey()}` } : {}; }
function askForKey(message) {
  $("key-row").hidden = false;
  $("api-key").focus();
  reportError(message);
}
$("api-key").value = sessionStorage.getItem("rtvoice-api-key") || "";
if ($("api-key").value) $("key-row").hidden = false;
$("api-key").addEventListener("change", () => {
  sessionStorage.setItem("rtvoice-api-key", apiKey());
  stats.errors = [];
  loadVoices().catch((error) => reportError(error.message));
});

// An error answer's message; a 401 also shows the key field.
async function failure(response) {
  let message = `HTTP ${response.status}`;
  try { message = (await response.json()).error.message; } catch (_) { /* not the error body */ }
  if (response.status === 401) askForKey(`${message}: enter the API key`);
  else reportError(message);
}

function beginRequest(transport) {
  stats.transport = transport;
  stats.requestSentAt = performance.now();
  stats.firstAudioAt = null;
  stats.ttfaMs = null;
  $("ttfa").textContent = "…";
}

function markFirstAudio() {
  if (stats.requestSentAt === null || stats.firstAudioAt !== null) return;
  stats.firstAudioAt = performance.now();
  stats.ttfaMs = Math.round(stats.firstAudioAt - stats.requestSentAt);
  $("ttfa").textContent = `${stats.ttfaMs} ms`;
}

function currentLevel() {
  if (!analyser) return 0;
  const samples = new Float32Array(analyser.fftSize);
  analyser.getFloatTimeDomainData(samples);
  let sum = 0;
  for (const s of samples) sum += s * s;
  return Math.sqrt(sum / samples.length);
}

function meterLoop() {
  const level = currentLevel();
  stats.maxLevel = Math.max(stats.maxLevel, level);
  $("level").style.width = `${Math.min(100, level * 400)}%`;
  requestAnimationFrame(meterLoop);
}

function reportError(message) {
  stats.errors.push(message);
  setState(`error: ${message}`);
}

// ---- PCM playback for the WebSocket and HTTP transports ------------------------------------------------------

class PcmPlayer {
  constructor() { this.nextTime = 0; this.sources = new Set(); this.carry = null; }

  // Takes raw little-endian int16 bytes at `rate` (chunks may split a sample) and schedules them gap-free.
  push(bytes, rate) {
    let data = new Uint8Array(bytes);
    if (this.carry) { const joined = new Uint8Array(this.carry.length + data.length); joined.set(this.carry);
      joined.set(data, this.carry.length); data = joined; this.carry = null; }
    if (data.length % 2) { this.carry = data.slice(-1); data = data.slice(0, -1); }
    if (!data.length) return;
    markFirstAudio();
    const samples = new Int16Array(data.buffer, data.byteOffset, data.length / 2);
    const ctx = audio();
    const buffer = ctx.createBuffer(1, samples.length, rate);
    const channel = buffer.getChannelData(0);
    for (let i = 0; i < samples.length; i++) channel[i] = samples[i] / 32768;
    const source = ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(analyser);
    this.nextTime = Math.max(this.nextTime, ctx.currentTime + 0.02);
    source.start(this.nextTime);
    this.nextTime += buffer.duration;
    this.sources.add(source);
    source.onended = () => this.sources.delete(source);
  }

  stop() {
    for (const source of this.sources) { try { source.stop(); } catch (_) { /* already ended */ } }
    this.sources.clear();
    this.nextTime = 0;
    this.carry = null;
  }
}

const player = new PcmPlayer();

// ---- HTTP: OpenAI's speech API, streamed PCM at 24 kHz -------------------------------------------------------

let httpAbort = null;

async function speakHttp(text, voice) {
  httpAbort = new AbortController();
  beginRequest("http");
  const response = await fetch("/v1/audio/speech", {
    method: "POST", signal: httpAbort.signal, headers: { "Content-Type": "application/json", ...authHeaders() },
    body: JSON.stringify({ model: "tts-1", input: text, voice, response_format: "pcm" }),
  });
  if (!response.ok) { await failure(response); return; }
  const rate = Number(response.headers.get("X-Sample-Rate") || 24000);
  const reader = response.body.getReader();
  setState("speaking (HTTP)");
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    player.push(value, rate);
  }
  setState("done");
}

// ---- WebSocket: text in, PCM out ------------------------------------------------------------------------------

let socket = null;
const WS_RATE = 24000;

function openSocket(voice) {
  return new Promise((resolve, reject) => {
    // Browsers cannot set headers on a WebSocket: the key goes in the query.
    const key = apiKey() ? `?api_key=${encodeURIComponent(apiKey())}` : "";
    const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/tts/stream${key}`;
    const ws = new WebSocket(url);
    ws.binaryType = "arraybuffer";
    ws.onopen = () => {
      ws.send(JSON.stringify({ type: "start", voice, sample_rate: WS_RATE, encoding: "pcm_s16le" }));
      resolve(ws);
    };
    ws.onerror = () => reject(new Error("WebSocket failed"));
    ws.onclose = () => { if (socket === ws) socket = null; };
    ws.onmessage = (message) => {
      if (typeof message.data !== "string") { player.push(message.data, WS_RATE); return; }
      const event = JSON.parse(message.data);
      stats.events.push(event);
      if (event.type === "error") reportError(event.message);
      else if (event.type === "audio_start") setState("speaking (WebSocket)");
      else if (event.type === "done") setState("done");
    };
  });
}

async function speakWebSocket(text, voice) {
  if (socket && socket.voice !== voice) { socket.close(); socket = null; }
  if (!socket) { socket = await openSocket(voice); socket.voice = voice; }
  beginRequest("websocket");
  socket.send(JSON.stringify({ type: "text", text }));
  socket.send(JSON.stringify({ type: "flush" }));
}

// ---- WebRTC: WHEP playback, text over a DataChannel -----------------------------------------------------------

let whep = null;

class WhepSession {
  async connect(voice) {
    this.pc = new RTCPeerConnection();
    this.pc.addTransceiver("audio", { direction: "recvonly" });
    this.channel = this.pc.createDataChannel("tts");
    this.channel.onmessage = (message) => {
      const event = JSON.parse(message.data);
      stats.events.push(event);
      if (event.type === "error") reportError(event.message);
      else if (event.type === "done") setState("done");
    };
    this.pc.ontrack = (event) => {
      const stream = event.streams[0] || new MediaStream([event.track]);
      $("player").srcObject = stream;  // Chrome only feeds remote audio to WebAudio while an element plays it
      audio().createMediaStreamSource(stream).connect(analyser);
    };
    await this.pc.setLocalDescription(await this.pc.createOffer());
    await new Promise((resolve) => {
      if (this.pc.iceGatheringState === "complete") return resolve();
      this.pc.addEventListener("icegatheringstatechange", () => {
        if (this.pc.iceGatheringState === "complete") resolve();
      });
    });
    const response = await fetch(`/whep?voice=${encodeURIComponent(voice)}`, {
      method: "POST", headers: { "Content-Type": "application/sdp", ...authHeaders() },
      body: this.pc.localDescription.sdp,
    });
    if (response.status !== 201) {
      await failure(response);
      throw new Error(stats.errors[stats.errors.length - 1]);
    }
    this.location = new URL(response.headers.get("Location"), location.href).toString();
    this.voice = voice;
    await this.pc.setRemoteDescription({ type: "answer", sdp: await response.text() });
    await new Promise((resolve, reject) => {
      if (this.channel.readyState === "open") return resolve();
      this.channel.onopen = resolve;
      setTimeout(() => reject(new Error("DataChannel did not open")), 10000);
    });
    stats.whepConnected = true;
  }

  // First audio: the receiver's audio level rises above silence (the server sends silence between utterances).
  watchFirstAudio() {
    clearInterval(this.watch);
    this.watch = setInterval(async () => {
      const report = await this.pc.getStats();
      report.forEach((s) => {
        if (s.type === "inbound-rtp" && s.kind === "audio") {
          stats.packetsReceived = s.packetsReceived;
          if ((s.audioLevel || 0) > 0.01 || currentLevel() > 0.01) markFirstAudio();
        }
      });
      if (stats.firstAudioAt !== null) clearInterval(this.watch);
    }, 10);
  }

  speak(text, voice) {
    beginRequest("webrtc");
    this.channel.send(JSON.stringify({ type: "tts_request", text, speaker_id: voice }));
    this.watchFirstAudio();
    setState("speaking (WebRTC)");
  }

  cancel() { if (this.channel && this.channel.readyState === "open") this.channel.send('{"type":"cancel"}'); }

  async close() {
    clearInterval(this.watch);
    if (this.location) await fetch(this.location, { method: "DELETE", headers: authHeaders() }).catch(() => {});
    this.pc.close();
    stats.whepConnected = false;
  }
}

async function speakWebRtc(text, voice) {
  if (!whep) {
    setState("connecting (WHEP)…");
    whep = new WhepSession();
    try { await whep.connect(voice); } catch (error) { whep = null; throw error; }
  }
  whep.speak(text, voice);
}

// ---- page wiring ----------------------------------------------------------------------------------------------

async function loadVoices() {
  const response = await fetch("/voices", { headers: authHeaders() });
  if (!response.ok) { await failure(response); return; }
  setState("idle");
  const voices = await response.json();
  $("voice").replaceChildren(...voices.map((v) => {
    const option = document.createElement("option");
    option.value = v.id;
    option.textContent = `${v.id} (${v.language}, ${v.model})`;
    return option;
  }));
}

async function speak() {
  const text = $("text").value;
  const voice = $("voice").value;
  audio();
  stop();
  $("stop").disabled = false;
  try {
    const transport = $("transport").value;
    if (transport === "http") await speakHttp(text, voice);
    else if (transport === "websocket") await speakWebSocket(text, voice);
    else await speakWebRtc(text, voice);
  } catch (error) {
    if (error.name !== "AbortError") reportError(error.message);
  }
}

function stop() {
  if (httpAbort) { httpAbort.abort(); httpAbort = null; }
  if (socket) socket.send(JSON.stringify({ type: "cancel" }));
  if (whep) whep.cancel();
  player.stop();
  $("stop").disabled = true;
  setState("idle");
}

$("speak").addEventListener("click", speak);
$("stop").addEventListener("click", stop);
$("transport").addEventListener("change", () => {
  if (whep && $("transport").value !== "webrtc") { whep.close(); whep = null; }
});
window.addEventListener("beforeunload", () => { if (whep) whep.close(); });
loadVoices().catch((error) => reportError(error.message));
