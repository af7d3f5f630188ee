#!/bin/bash
S=/tmp/s48
$S/abrun.sh $S/abP $S/../s47/oldp $S/base "1 2 3" "lstm-lm 500mbit" "gpt 500mbit" "lstm-lm 50mbit" "gpt 50mbit"
$S/abrun.sh $S/abR $S/head $S/ratio "1 2 3" "gpt 500mbit" "lstm-lm 500mbit" "mlp-lm 500mbit"
$S/abrun.sh $S/abB $S/base $S/head "1 2 3" "lstm-lm 500mbit"
