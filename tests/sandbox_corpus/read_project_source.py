# attack: reads the project's own source by absolute path
# mode: function
# expect: wrong answer|runtime error
def add(a, b):
    return open("@@PROJECT_FILE@@").read()
