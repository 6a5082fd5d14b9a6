// AudioWorklet: the level of what the player hears, in 128-sample render quanta (about 2.7 ms).
// Armed by the page when it sends text; posts the first quantum above the threshold (the first audible frame),
// and keeps the energy and peak of everything heard since, so the test can check speech really arrived.
// Between "record" and "stop" it also keeps every sample it renders (the first channel) and posts them back.
class Onset extends AudioWorkletProcessor {
  constructor() {
    super();
    this.armed = false;
    this.threshold = 0.01;
    this.energy = 0;
    this.samples = 0;
    this.peak = 0;
    this.recording = null;
    this.port.onmessage = (message) => {
      if (message.data.type === "arm") {
        this.armed = true;
        this.threshold = message.data.threshold;
        this.energy = 0;
        this.samples = 0;
        this.peak = 0;
      } else if (message.data.type === "report") {
        this.port.postMessage({ type: "report", energy: this.energy, samples: this.samples, peak: this.peak });
      } else if (message.data.type === "record") {
        this.recording = [];
      } else if (message.data.type === "stop") {
        const quanta = this.recording || [];
        this.recording = null;
        const samples = new Float32Array(quanta.reduce((n, quantum) => n + quantum.length, 0));
        let offset = 0;
        for (const quantum of quanta) { samples.set(quantum, offset); offset += quantum.length; }
        this.port.postMessage({ type: "recorded", samples }, [samples.buffer]);
      }
    };
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (!channel) return true;
    if (this.recording) this.recording.push(channel.slice());
    let sum = 0;
    let peak = 0;
    for (const sample of channel) {
      sum += sample * sample;
      peak = Math.max(peak, Math.abs(sample));
    }
    this.energy += sum;
    this.samples += channel.length;
    this.peak = Math.max(this.peak, peak);
    if (this.armed && Math.sqrt(sum / channel.length) > this.threshold) {
      this.armed = false;
      this.port.postMessage({ type: "onset", contextTime: currentTime });
    }
    return true;
  }
}

registerProcessor("onset", Onset);
