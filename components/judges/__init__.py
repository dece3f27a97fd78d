"""What every LLM judgment shares: the call (:mod:`components.judges.call`: prompt, sampling, structured-output
schema, parse, and a verdict or a failure as a value, never a score), the texts judges are shown for a
trajectory (:mod:`components.judges.render`), the orders that cancel a judge's position bias
(:mod:`components.judges.orders`), and the answer judge behind LLM-judge accuracy (:mod:`components.judges.answer`).
The methods' own judges live in their packages and make their calls through :mod:`components.judges.call`.
"""
