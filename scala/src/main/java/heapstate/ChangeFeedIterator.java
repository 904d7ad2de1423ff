package heapstate;

/**
 * The base of heapstate's change feed. Spark's {@code SupportsFineGrainedReplay} must return an
 * {@code org.apache.spark.util.NextIterator}, which Scala code outside Spark's packages cannot
 * name; Java can, so this class adapts it to a plain "return the next record or null" method.
 */
public abstract class ChangeFeedIterator<U> extends org.apache.spark.util.NextIterator<U> {
  /** The next record, or null at the end. */
  protected abstract U nextRecord();

  @Override
  public U getNext() {
    U next = nextRecord();
    if (next == null) {
      finished_$eq(true);
    }
    return next;
  }

  @Override
  public void close() {}
}
