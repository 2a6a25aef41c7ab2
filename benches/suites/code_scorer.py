def score(output, context):
    return {"pass": output == "yes", "score": 1.0 if output == "yes" else 0.0, "reason": "said %r" % output}
