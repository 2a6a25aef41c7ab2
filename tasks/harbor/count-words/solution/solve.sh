#!/bin/bash
cd /app
wc -w < data/essay.txt | tr -d ' ' > count.txt
