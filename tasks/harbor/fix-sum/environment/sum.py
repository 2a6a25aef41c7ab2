import sys


def total(numbers):
    result = 0
    for n in numbers[1:]:
        result += n
    return result


if __name__ == "__main__":
    print(total([int(a) for a in sys.argv[1:]]))
