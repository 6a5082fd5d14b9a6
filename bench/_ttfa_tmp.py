import time, statistics, httpx, sys
from testkit.servers import start_rtvoice
env = dict(a.split("=",1) for a in sys.argv[1:])
s = start_rtvoice(env)
text = "The quick brown fox jumps over the lazy dog by the river."
def calls():
    return {(l["kind"]): (v) for l, v in s.samples("rtvoice_model_call_seconds_sum")}, {(l["kind"]): (v) for l, v in s.samples("rtvoice_model_call_seconds_count")}
try:
    with httpx.Client(timeout=30) as c:
        for _ in range(3):
            c.post(s.url + "/inference_sft", data={"tts_text": text, "format": "pcm"})
        res = []
        for i in range(20):
            s0, n0 = calls()
            t = time.perf_counter()
            if env.get("RTVOICE_TRACE"): open(env["RTVOICE_TRACE"], "a").write(f"client-send {t:.4f}\n")
            with c.stream("POST", s.url + "/inference_sft", data={"tts_text": text, "format": "pcm"}) as r:
                it = r.iter_bytes()
                first = next(it)
                ttfa = time.perf_counter() - t
                if env.get("RTVOICE_TRACE"): open(env["RTVOICE_TRACE"], "a").write(f"client-first {t+ttfa:.4f}\n")
                for _ in it: pass
            s1, n1 = calls()
            res.append(ttfa)
        print("ttfa p50 %.1f ms min %.1f" % (statistics.median(res) * 1e3, min(res) * 1e3))
        print({k: (round((s1[k]-s0.get(k,0))*1e3,1), n1[k]-n0.get(k,0)) for k in s1})
finally:
    s.stop()
