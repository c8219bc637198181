"""The fast path: the decision table the runner publishes, the books its reports feed, its
summaries, its APISIX route, and the Lua plugin that decides from the table (package data under
``lua/``). ``contract`` declares what both halves must agree on."""
