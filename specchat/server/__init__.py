"""`specchat serve`: the speculative engine behind an OpenAI-compatible HTTP API.

A thin layer over the same session code the terminal chat uses (`decoding.session`: an `Engine` with
the GGUF chat template, `decoding.loop.generate` with KV prefix reuse); like `cli.render` for the
terminal, it only consumes the loop's events. May import the foundations and `specchat.decoding`; never
llama_cpp or `specchat.llama` (the CLI hands it loaded models), nor `specchat.cli`.

  fields.py     the requests' error (ApiError) and the checks of one field, shared by the parsers
  api.py        the OpenAI wire format's requests: parsing and validation
  responses.py  and its responses: response and chunk bodies, usage, logprobs
  stops.py      stop strings: cut at the first one, hold back text that may be the start of one
  worker.py     the one generation thread, its bounded queue, cancellation and shutdown
  availability.py  503 while a split target's RPC worker is gone, and the models loaded anew after
  app.py        Starlette routes, API-key check, server-sent events, uvicorn in a thread
"""
