#!/bin/bash
S=/tmp/s48
$S/abrun.sh $S/abR $S/head $S/ratio "1 2 3" "gpt 500mbit" "lstm-lm 500mbit" "mlp-lm 500mbit"
$S/abrun.sh $S/abB $S/nofix $S/head "1 2 3" "lstm-lm 500mbit"
