// rtvoice demo page: one text box, three transports (WHEP/WebRTC, WebSocket, HTTP), a TTFA readout, a level meter,
// and the text with each word highlighted as it is heard (WebRTC and WebSocket send word events). No build step:
// plain browser JavaScript.
"use strict";

const $ = (id) => document.getElementById(id);

// What the page measured, for people (the readout) and for the browser test (window.rtvoice).
const stats = (window.rtvoice = {
  transport: null, requestSentAt: null, firstAudioAt: null, ttfaMs: null, maxLevel: 0,
  events: [], errors: [], whepConnected: false,
  highlights: [], heard: null, stoppedAt: null,  // words as highlighted (performance.now()), the text heard at Stop
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
  transcript.tick();
  requestAnimationFrame(meterLoop);
}

function reportError(message) {
  stats.errors.push(message);
  setState(`error: ${message}`);
}

// ---- words: the text being spoken, each word highlighted while it is heard; what was heard at Stop --------------

// Word events (WebSocket and WHEP) carry the word as sent (`text`, `char_start`/`char_end` in the utterance's text)
// and its place in the utterance's audio (`start_s`, `end_s`). Each transport says when that audio plays here;
// the transcript highlights the word then.
class Transcript {
  constructor() { this.text = ""; this.words = []; this.current = null; this.heardEnd = null; }

  begin(text) {
    Object.assign(this, { text, words: [], current: null, heardEnd: null });
    stats.highlights = [];
    stats.heard = null;
    $("heard").hidden = true;
    this.render();
  }

  // `word` starts playing at `startsAt()` (performance.now() time, asked again on each tick: a transport may
  // learn its playout delay only once audio plays); it is highlighted from then until the next one.
  at(word, startsAt) { this.words.push({ ...word, startsAt, shown: false }); }

  // Called on every animation frame.
  tick() {
    if (this.heardEnd !== null) return;
    const now = performance.now();
    let changed = false;
    for (const word of this.words) {
      if (word.shown || word.startsAt() > now) continue;
      word.shown = true;
      changed = true;
      this.current = word;
      stats.highlights.push({ text: word.text, char_start: word.char_start, char_end: word.char_end,
                              start_s: word.start_s, at: now });
    }
    if (changed) this.render();
  }

  // The last word whose audio has all played by now, on this page's clock.
  lastPlayed() {
    const now = performance.now();
    let last = null;
    for (const word of this.words) if (word.startsAt() + (word.end_s - word.start_s) * 1000 <= now) last = word;
    return last;
  }

  // Stop: the text up to the end of `lastWord` (null: nothing whole) was heard; nothing more is highlighted.
  showHeard(lastWord) {
    this.heardEnd = lastWord ? lastWord.char_end : 0;
    stats.heard = this.text.slice(0, this.heardEnd);
    $("heard-text").textContent = stats.heard || "(no whole word yet)";
    $("heard").hidden = false;
    this.render();
  }

  // No more highlights (the words' audio was dropped).
  clear() { this.words = []; }

  render() {
    const span = (className, text) => {
      const element = document.createElement(className === "current" ? "mark" : "span");
      if (className !== "current") element.className = className;
      element.textContent = text;
      return element;
    };
    const { text, current } = this;
    if (this.heardEnd !== null) {
      $("transcript").replaceChildren(span("heard", text.slice(0, this.heardEnd)), text.slice(this.heardEnd));
    } else if (current) {
      $("transcript").replaceChildren(span("heard", text.slice(0, current.char_start)),
        span("current", text.slice(current.char_start, current.char_end)), text.slice(current.char_end));
    } else {
      $("transcript").replaceChildren(text);
    }
  }
}

const transcript = new Transcript();

// ---- PCM playback for the WebSocket and HTTP transports ------------------------------------------------------

class PcmPlayer {
  constructor() { this.nextTime = 0; this.sources = new Set(); this.carry = null; }

  // Takes raw little-endian int16 bytes at `rate` (chunks may split a sample) and schedules them gap-free;
  // returns how many samples it scheduled and the AudioContext time the first one plays (null for none).
  push(bytes, rate) {
    let data = new Uint8Array(bytes);
    if (this.carry) { const joined = new Uint8Array(this.carry.length + data.length); joined.set(this.carry);
      joined.set(data, this.carry.length); data = joined; this.carry = null; }
    if (data.length % 2) { this.carry = data.slice(-1); data = data.slice(0, -1); }
    if (!data.length) return null;
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
    const at = this.nextTime;
    this.nextTime += buffer.duration;
    this.sources.add(source);
    source.onended = () => this.sources.delete(source);
    return { samples: samples.length, at };
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

// A WebSocket utterance's words are sent before the audio that holds their start. Each waits here until that
// audio is scheduled on the page's AudioContext; it is heard at that sample's time (plus the output's latency),
// so a word follows the page's own playback, underruns included.
const wsWords = {
  utterance: null, pending: [], samples: 0,

  begin(utterance) { Object.assign(this, { utterance, pending: [], samples: 0 }); },

  word(event) { if (event.utterance === this.utterance) this.pending.push(event); },

  scheduled(played) {  // the utterance's next `played.samples` samples play from context time `played.at`
    if (this.utterance === null || !played) return;
    const end = this.samples + played.samples;
    while (this.pending.length && this.pending[0].start_s * WS_RATE < end) {
      const word = this.pending.shift();
      const offset = Math.max(0, word.start_s * WS_RATE - this.samples) / WS_RATE;
      this.hearAt(word, played.at + offset);
    }
    this.samples = end;
  },

  done(event) {  // words that start in no sample the page got (none, normally) are heard as its audio ends
    if (event.utterance !== this.utterance) return;
    for (const word of this.pending.splice(0)) this.hearAt(word, player.nextTime);
  },

  hearAt(word, contextTime) {
    const ctx = audio();
    const startsAt = performance.now() + (contextTime - ctx.currentTime + (ctx.outputLatency || 0)) * 1000;
    transcript.at(word, () => startsAt);
  },
};

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
      if (typeof message.data !== "string") { wsWords.scheduled(player.push(message.data, WS_RATE)); return; }
      const event = JSON.parse(message.data);
      stats.events.push(event);
      if (event.type === "error") reportError(event.message);
      else if (event.type === "audio_start") { wsWords.begin(event.utterance); setState("speaking (WebSocket)"); }
      else if (event.type === "word") wsWords.word(event);
      else if (event.type === "done") { wsWords.done(event); setState("done"); }
    };
  });
}

async function speakWebSocket(text, voice) {
  if (socket && socket.voice !== voice) { socket.close(); socket = null; }
  if (!socket) { socket = await openSocket(voice); socket.voice = voice; }
  beginRequest("websocket");
  wsWords.begin(null);  // until this utterance's audio_start
  socket.send(JSON.stringify({ type: "text", text }));
  socket.send(JSON.stringify({ type: "flush" }));
}

// ---- WebRTC: WHEP playback, text over a DataChannel -----------------------------------------------------------

let whep = null;
let whepRequests = 0;

class WhepSession {
  async connect(voice) {
    this.pc = new RTCPeerConnection();
    this.pc.addTransceiver("audio", { direction: "recvonly" });
    this.channel = this.pc.createDataChannel("tts");
    this.playoutDelayMs = null;  // until the player has played out audio
    this.channel.onmessage = (message) => {
      const event = JSON.parse(message.data);
      stats.events.push(event);
      if (typeof event.request_id === "string" && event.request_id !== this.requestId) return;  // an earlier one's
      if (event.type === "error") { this.speaking = false; reportError(event.message); }
      else if (event.type === "word") {
        const arrived = performance.now();
        transcript.at(event, () => (this.playoutDelayMs === null ? Infinity : arrived + this.playoutDelayMs));
      }
      else if (event.type === "done") { this.speaking = false; setState("done"); }
      else if (event.type === "cancelled") {
        this.speaking = false;
        if (this.stopPressed) transcript.showHeard(event.last_word);  // played out, as the server counts it
      }
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
    this.watchPlayoutDelay();
  }

  // A word event leaves the server with the frame that holds the word's start; the browser plays that frame after
  // its jitter buffer's delay (the mean of the frames it played out), so the word is highlighted that much later.
  watchPlayoutDelay() {
    this.playout = setInterval(async () => {
      (await this.pc.getStats()).forEach((s) => {
        if (s.type === "inbound-rtp" && s.kind === "audio") this.playoutDelay(s);
      });
    }, 100);
  }

  playoutDelay(inbound) {
    if (inbound.jitterBufferEmittedCount > 0) {
      this.playoutDelayMs = (inbound.jitterBufferDelay / inbound.jitterBufferEmittedCount) * 1000;
      stats.playoutDelayMs = this.playoutDelayMs;
    }
  }

  // First audio: the receiver's audio level rises above silence (the server sends silence between utterances).
  watchFirstAudio() {
    clearInterval(this.watch);
    this.watch = setInterval(async () => {
      const report = await this.pc.getStats();
      report.forEach((s) => {
        if (s.type === "inbound-rtp" && s.kind === "audio") {
          stats.packetsReceived = s.packetsReceived;
          this.playoutDelay(s);
          if ((s.audioLevel || 0) > 0.01 || currentLevel() > 0.01) markFirstAudio();
        }
      });
      if (stats.firstAudioAt !== null) clearInterval(this.watch);
    }, 10);
  }

  speak(text, voice) {
    beginRequest("webrtc");
    this.requestId = `page-${++whepRequests}`;
    this.speaking = true;
    this.stopPressed = false;
    this.channel.send(JSON.stringify({ type: "tts_request", text, speaker_id: voice, request_id: this.requestId }));
    this.watchFirstAudio();
    setState("speaking (WebRTC)");
  }

  // Stop: the server's `cancelled` says what was played out; an utterance already done was heard to its end.
  cancel(pressed) {
    this.stopPressed = pressed;
    if (pressed && !this.speaking) transcript.showHeard(transcript.lastPlayed());
    if (this.channel && this.channel.readyState === "open") this.channel.send('{"type":"cancel"}');
  }

  async close() {
    clearInterval(this.watch);
    clearInterval(this.playout);
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
  stop(false);
  $("stop").disabled = false;
  transcript.begin($("transport").value === "http" ? "" : text);  // HTTP's PCM carries no word timings
  try {
    const transport = $("transport").value;
    if (transport === "http") await speakHttp(text, voice);
    else if (transport === "websocket") await speakWebSocket(text, voice);
    else await speakWebRtc(text, voice);
  } catch (error) {
    if (error.name !== "AbortError") reportError(error.message);
  }
}

// `pressed`: by the user, who then sees what was heard (the page's playback for the WebSocket, whose audio arrives
// ahead of it; the server's count of what left for the player for WebRTC).
function stop(pressed) {
  if (pressed) stats.stoppedAt = performance.now();
  if (httpAbort) { httpAbort.abort(); httpAbort = null; }
  if (socket) {
    socket.send(JSON.stringify({ type: "cancel" }));
    if (pressed && stats.transport === "websocket") transcript.showHeard(transcript.lastPlayed());
    wsWords.begin(null);
  }
  if (whep) whep.cancel(pressed && stats.transport === "webrtc");
  if (!pressed) transcript.clear();
  player.stop();
  $("stop").disabled = true;
  setState("idle");
}

$("speak").addEventListener("click", speak);
$("stop").addEventListener("click", () => stop(true));
$("transport").addEventListener("change", () => {
  if (whep && $("transport").value !== "webrtc") { whep.close(); whep = null; }
});
window.addEventListener("beforeunload", () => { if (whep) whep.close(); });
loadVoices().catch((error) => reportError(error.message));
