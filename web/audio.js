// The page's audio: one AudioContext and level analyser, a gap-free player for raw int16 PCM that keeps what it
// played (for the WAV download, the waveform and the history), a recorder of what a WebRTC track played, and WAV
// encoding.

let context = null;
let analyserNode = null;

/** The page's AudioContext (made on first use, resumed if a browser suspended it). */
export function audio() {
  if (!context) {
    context = new AudioContext();
    analyserNode = context.createAnalyser();
    analyserNode.fftSize = 1024;
    analyserNode.connect(context.destination);
  }
  if (context.state === "suspended") context.resume();
  return context;
}

export function analyser() { audio(); return analyserNode; }

/** The output's RMS level now (0 before any audio). */
export function currentLevel() {
  if (!analyserNode) return 0;
  const samples = new Float32Array(analyserNode.fftSize);
  analyserNode.getFloatTimeDomainData(samples);
  let sum = 0;
  for (const s of samples) sum += s * s;
  return Math.sqrt(sum / samples.length);
}

/** Schedules raw little-endian int16 chunks back to back and records each chunk with the context time it plays
 * at, so that what was heard up to any moment (Stop included) can be cut out exactly. */
export class PcmPlayer {
  constructor() { this.reset(); this.onIdle = null; }

  reset() {
    this.nextTime = 0; this.sources = new Set(); this.carry = null; this.chunks = []; this.rate = null;
    this.cutAt = null; this.underruns = 0;
  }

  // Takes bytes at `rate` (chunks may split a sample); returns how many samples it scheduled and the context time
  // the first one plays (null for none).
  push(bytes, rate) {
    let data = new Uint8Array(bytes);
    if (this.carry) {
      const joined = new Uint8Array(this.carry.length + data.length);
      joined.set(this.carry); joined.set(data, this.carry.length); data = joined; this.carry = null;
    }
    if (data.length % 2) { this.carry = data.slice(-1); data = data.slice(0, -1); }
    if (!data.length) return null;
    const samples = new Int16Array(data.buffer.slice(data.byteOffset, data.byteOffset + data.length));
    return this.schedule(samples, rate);
  }

  schedule(samples, rate) {
    const ctx = audio();
    const buffer = ctx.createBuffer(1, samples.length, rate);
    const channel = buffer.getChannelData(0);
    for (let i = 0; i < samples.length; i++) channel[i] = samples[i] / 32768;
    const source = ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(analyserNode);
    // A chunk that comes after the previous one finished playing leaves a gap: an underrun, heard as a pause.
    if (this.chunks.length && this.nextTime < ctx.currentTime) this.underruns += 1;
    this.nextTime = Math.max(this.nextTime, ctx.currentTime + 0.02);
    source.start(this.nextTime);
    const at = this.nextTime;
    this.nextTime += buffer.duration;
    this.rate = rate;
    this.chunks.push({ samples, at });
    this.sources.add(source);
    source.onended = () => {
      this.sources.delete(source);
      if (!this.sources.size && this.onIdle) this.onIdle();
    };
    return { samples: samples.length, at };
  }

  /** Whether anything scheduled is still to play. */
  get playing() { return this.sources.size > 0; }

  /** The samples heard: all of them, or those before Stop. */
  heard() {
    const parts = [];
    for (const { samples, at } of this.chunks) {
      if (this.cutAt === null) { parts.push(samples); continue; }
      const keep = Math.max(0, Math.min(samples.length, Math.round((this.cutAt - at) * this.rate)));
      if (keep) parts.push(samples.subarray(0, keep));
    }
    const out = new Int16Array(parts.reduce((n, p) => n + p.length, 0));
    let offset = 0;
    for (const part of parts) { out.set(part, offset); offset += part.length; }
    return out;
  }

  /** Stop playing at once; what played so far stays as the heard audio. */
  stop() {
    if (this.chunks.length && this.cutAt === null && context) this.cutAt = context.currentTime;
    for (const source of this.sources) {
      source.onended = null;
      try { source.stop(); } catch (_) { /* already ended */ }
    }
    this.sources.clear();
    this.nextTime = 0;
    this.carry = null;
  }
}

/** What a media stream (a WebRTC track) plays, recorded between `start` and `stop` by an AudioWorklet
 * (`recorder.js`), so that the WAV download has the audio heard on that transport too. */
export class TrackRecorder {
  constructor() { this.node = null; this.blocks = []; this.recording = false; }

  async attach(stream) {
    const ctx = audio();
    await ctx.audioWorklet.addModule(new URL("./recorder.js", import.meta.url));
    this.node = new AudioWorkletNode(ctx, "rtvoice-recorder");
    this.node.port.onmessage = (message) => this.blocks.push(message.data);
    if (this.recording) this.node.port.postMessage("start");
    ctx.createMediaStreamSource(stream).connect(this.node);
    this.node.connect(ctx.destination);  // a node is only run while it reaches the output; it writes silence
  }

  start() {
    this.blocks = [];
    this.recording = true;
    if (this.node) this.node.port.postMessage("start");
  }

  /** The samples recorded since `start`, as int16 at the context's rate, without the silence before the first
   * sound and after the last (the track carries silence between utterances). */
  stop() {
    this.recording = false;
    if (this.node) this.node.port.postMessage("stop");
    const total = this.blocks.reduce((n, b) => n + b.length, 0);
    const all = new Float32Array(total);
    let offset = 0;
    for (const block of this.blocks) { all.set(block, offset); offset += block.length; }
    this.blocks = [];
    const audible = (s) => Math.abs(s) > SILENCE_LEVEL;
    const first = all.findIndex(audible);
    if (first < 0) return new Int16Array(0);
    let last = all.length - 1;
    while (!audible(all[last])) last--;
    const out = new Int16Array(last + 1 - first);
    for (let i = 0; i < out.length; i++) out[i] = Math.max(-32768, Math.min(32767, Math.round(all[first + i] * 32768)));
    return out;
  }

  get rate() { return context ? context.sampleRate : null; }
}

const SILENCE_LEVEL = 1e-3;  // -60 dBFS: below any speech, above what Opus decodes settled silence to

/** A mono 16-bit WAV file of `samples` at `rate`. */
export function wavBlob(samples, rate) {
  const header = new DataView(new ArrayBuffer(44));
  const text = (offset, value) => { for (let i = 0; i < 4; i++) header.setUint8(offset + i, value.charCodeAt(i)); };
  text(0, "RIFF"); header.setUint32(4, 36 + samples.length * 2, true); text(8, "WAVE");
  text(12, "fmt "); header.setUint32(16, 16, true); header.setUint16(20, 1, true); header.setUint16(22, 1, true);
  header.setUint32(24, rate, true); header.setUint32(28, rate * 2, true); header.setUint16(32, 2, true);
  header.setUint16(34, 16, true); text(36, "data"); header.setUint32(40, samples.length * 2, true);
  return new Blob([header.buffer, samples.buffer.slice(samples.byteOffset, samples.byteOffset + samples.byteLength)],
    { type: "audio/wav" });
}
