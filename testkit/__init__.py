"""What the tests and the benchmarks both use, so that neither imports the other: real servers on loopback
(``servers.py``), the one wait helper (``polling.py``), headless Chromium and the WHEP player page
(``browser.py``), a WHEP player in Python (``whep_client.py``), the forced aligner word timings are checked against
(``alignment.py``). Not installed: it lives beside the checkout's
``tests/`` and ``bench/``."""
