package wire

import (
	"fmt"
	"time"
)

// ErlangType names a field value's AMQP type the way RabbitMQ prints it in
// its error texts (for example "longstr", "signedint", "table"), so reply
// texts can match RabbitMQ's exactly.
func ErlangType(v any) string {
	switch v.(type) {
	case bool:
		return "bool"
	case int8:
		return "byte"
	case uint8:
		return "unsignedbyte"
	case int16:
		return "short"
	case uint16:
		return "unsignedshort"
	case int32:
		return "signedint"
	case uint32:
		return "unsignedint"
	case int64, int:
		return "long"
	case float32:
		return "float"
	case float64:
		return "double"
	case Decimal:
		return "decimal"
	case string:
		return "longstr"
	case []byte:
		return "binary"
	case []any:
		return "array"
	case time.Time:
		return "timestamp"
	case Table, map[string]any:
		return "table"
	case nil:
		return "void"
	}
	return fmt.Sprintf("%T", v)
}
