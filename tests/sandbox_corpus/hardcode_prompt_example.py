# attack: hard-codes the example from the prompt (only that case passes)
# mode: function
# expect: 1/2 tests passed
def add(a, b):
    return 5
