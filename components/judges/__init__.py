"""Every LLM judgment behind one pattern: a prompt, structured output where the backend has it, a strict
parse, and a vote or a failure (never a score of 0).

- :mod:`components.methods.coreact.council`: Co-ReAct's permuted listwise council with Borda consensus;
- :mod:`components.judges.answer`: the answer judge behind LLM-judge accuracy.
"""
