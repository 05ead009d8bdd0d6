# attack: returns almost a megabyte of JSON made of empty objects, to make the trusted side build them all
# mode: function
# expect: wrong answer \(the return value is far larger
def add(a, b):
    return [{}] * 200_000
